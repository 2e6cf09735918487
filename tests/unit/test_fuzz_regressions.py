"""Every input saved under tests/fuzz/corpus (seeds and what ``make fuzz`` found) through its
target: each ends normally or in one of the parser's typed errors (tests/fuzz/targets.py)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

TESTS_DIR = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(TESTS_DIR))

from fuzz.targets import TARGETS, run_one  # noqa: E402

CORPUS = TESTS_DIR / "fuzz" / "corpus"
INPUTS = sorted(p for p in CORPUS.glob("*/*") if p.is_file())


def test_every_target_has_seeds():
    assert {p.parent.name for p in INPUTS} == set(TARGETS)


@pytest.mark.timeout(30)
@pytest.mark.parametrize("path", INPUTS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_saved_input(path):
    run_one(path.parent.name, path.read_bytes())
