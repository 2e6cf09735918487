#!/usr/bin/env python3
"""`make typecheck`: mypy over the tidewater.* packages that [tool.mypy] names.

Why a link tree: the folders (broker/, proto/, ...) install as tidewater.broker,
tidewater.proto, ... through setuptools' package-dir mapping. The editable install
serves that mapping with an import hook (a meta-path finder in site-packages), and
mypy resolves imports by walking directories, never by running import hooks. No
directory in the repository is ``tidewater/``, so ``tidewater.broker.storage.log``
cannot be found, and checking the folders as ``broker.storage.log`` would name every
module differently from the code that imports it. This script lays the mapping out
as relative symlinks, build/typecheck/tidewater/<folder> -> <folder>, which
[tool.mypy]'s mypy_path points at, then runs mypy and prints paths as the
repository's own (broker/storage/log.py rather than build/typecheck/tidewater/...).

Exit status: mypy's. Extra arguments go to mypy.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TREE = Path("build/typecheck")  # relative to ROOT, as mypy_path in pyproject.toml


def link_tree() -> dict[str, str]:
    """Create TREE/tidewater/<folder> links; return {link prefix: folder prefix}."""
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    mapping: dict[str, str] = pyproject["tool"]["setuptools"]["package-dir"]
    namespace = ROOT / TREE / "tidewater"
    namespace.mkdir(parents=True, exist_ok=True)
    prefixes: dict[str, str] = {}
    for package, folder in mapping.items():
        top, _, name = package.partition(".")
        assert top == "tidewater" and "." not in name, package
        link = namespace / name
        target = os.path.relpath(ROOT / folder, namespace)
        if not (link.is_symlink() and os.readlink(link) == target):
            if link.is_symlink():
                link.unlink()
            link.symlink_to(target, target_is_directory=True)
        prefixes[f"{TREE}/tidewater/{name}/"] = f"{folder}/"
    return prefixes


def main() -> int:
    prefixes = link_tree()
    proc = subprocess.run([sys.executable, "-m", "mypy", *sys.argv[1:]], cwd=ROOT,
                          capture_output=True, text=True)
    pattern = re.compile("|".join(re.escape(p) for p in prefixes))
    sys.stdout.write(pattern.sub(lambda m: prefixes[m.group(0)], proc.stdout))
    sys.stderr.write(proc.stderr)
    return proc.returncode


if __name__ == "__main__":
    sys.exit(main())
