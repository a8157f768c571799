"""Zabbix templates generated from gpufleet's metric catalogue and alert rules (export.py)."""
