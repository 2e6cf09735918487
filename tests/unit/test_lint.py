"""`make lint` and `make typecheck` stay clean: ruff over the whole tree and mypy over the
packages [tool.mypy] lists, as configured in pyproject.toml."""

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def test_ruff_is_clean():
    try:
        import ruff  # noqa: F401
    except ImportError:
        if shutil.which("ruff") is None:
            pytest.skip("ruff is not installed (it is in the dev extra)")
    proc = subprocess.run([sys.executable, "-m", "ruff", "check", "."], cwd=ROOT,
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_mypy_is_clean():
    # `make typecheck`: mypy, strict, over the packages [tool.mypy] lists (a few seconds).
    try:
        import mypy  # noqa: F401
    except ImportError:
        pytest.skip("mypy is not installed (it is in the dev extra)")
    proc = subprocess.run([sys.executable, str(ROOT / ".ci" / "typecheck.py")], cwd=ROOT,
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
