"""The mutation score (scripts/mutation_score.py, docs/coverage.md): timeouts count as killed,
explained survivors leave the score, and an explanation that no longer fits its mutant (mutmut
renumbers a changed function's mutants) is reported rather than trusted."""

from __future__ import annotations

from collections import Counter
from types import ModuleType

import pytest

from tests.support.paths import script_module


@pytest.fixture(scope="module")
def ms() -> ModuleType:
    return script_module("mutation_score")


def test_a_timeout_is_killed_and_an_equivalent_is_out_of_the_count(ms: ModuleType) -> None:
    counts = Counter({"killed": 8, "timeout": 1, "survived": 1, "equivalent": 5, "no tests": 3})
    assert ms.score(counts) == (90.0, 9, 10)


def test_the_report_rows_per_module_and_in_all(ms: ModuleType) -> None:
    found = {"gpufleet.a.x_f__mutmut_1": "killed", "gpufleet.a.x_f__mutmut_2": "survived",
             "gpufleet.b.xǁCǁm__mutmut_1": "equivalent",
             "gpufleet.b.xǁCǁm__mutmut_2": "timeout"}  # fmt: skip
    assert ms.report(found)[2:] == [
        "| gpufleet.a | 1 | 1 | 0 | 0 | 50.0 % |",
        "| gpufleet.b | 1 | 0 | 1 | 0 | 100.0 % |",
        "| **all** | 2 | 1 | 1 | 0 | **66.7 %** |",
    ]


def test_an_explanation_must_still_fit_a_surviving_mutant(
    ms: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    shown = {"m.x_f__mutmut_1": ["-if a or b:", "+if a and b:"], "m.x_f__mutmut_2": ["-x = 1"]}
    monkeypatch.setattr(ms, "mutated_lines", lambda name: shown[name])
    found = {"m.x_f__mutmut_1": "survived", "m.x_f__mutmut_2": "survived",
             "m.x_f__mutmut_3": "killed"}  # fmt: skip
    explained = {
        "m.x_f__mutmut_1": {"mutation": "+if a and b:", "why": "same truth table here"},
        "m.x_f__mutmut_2": {"mutation": "+if a or b:", "why": "renumbered since"},
        "m.x_f__mutmut_3": {"mutation": "x", "why": "a test kills it now"},
        "m.x_f__mutmut_9": {"mutation": "x", "why": "the function lost mutants"},
    }
    assert ms.stale(explained, found) == [
        "m.x_f__mutmut_2: now changes ['-x = 1'], not '+if a or b:'",
        "m.x_f__mutmut_3: killed, not a survivor",
        "m.x_f__mutmut_9: no such mutant, not a survivor",
    ]


def test_every_explanation_in_pyproject_says_what_it_changes_and_why(ms: ModuleType) -> None:
    for name, entry in ms.equivalents().items():
        assert name.startswith("gpufleet.") and "__mutmut_" in name, name
        assert sorted(entry) == ["mutation", "why"], name
        assert entry["mutation"][:1] in "+-" and entry["mutation"][1:].strip(), name
        assert len(entry["why"]) > 20, name
