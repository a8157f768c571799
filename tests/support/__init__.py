"""Shared helpers of the tests: plain modules, never test modules (tests/README.md lists them)."""
