"""The project installs under one namespace, tidewater.*: nothing generic at the top level.

The folders (broker/, controller/, client/, proto/, audit/, tools/) stay at the top
of the repository and map to tidewater.<folder> (pyproject's [tool.setuptools]).
``proto`` is also proto-plus's import name, so a top-level ``proto`` would break
Google's cloud libraries beside us (or us beside them).
"""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FOLDERS = ("audit", "broker", "client", "controller", "proto", "tools")
SOURCE_DIRS = (*FOLDERS, "tests", "bench", "deploy")
BARE_IMPORT = re.compile(rf"^\s*(from|import)\s+({'|'.join(FOLDERS)})(\.|\s|$)", re.M)


def test_pyproject_lists_every_package_folder_under_the_namespace():
    setuptools = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    on_disk = sorted(
        "tidewater." + ".".join(init.parent.relative_to(ROOT).parts)
        for folder in FOLDERS for init in (ROOT / folder).rglob("__init__.py")
        if "__pycache__" not in init.parts)
    assert sorted(setuptools["packages"]) == on_disk
    assert setuptools["package-dir"] == {f"tidewater.{f}": f for f in FOLDERS}


def test_no_module_imports_a_folder_by_its_bare_name():
    # Inside the repository the folders are importable by their bare names too (the
    # working directory is on sys.path): one such import would load a second copy of
    # a module, with its own globals.
    offenders = [
        f"{path.relative_to(ROOT)}:{text[:match.start()].count(chr(10)) + 1}"
        for folder in SOURCE_DIRS for path in (ROOT / folder).rglob("*.py")
        if "_pb2" not in path.name
        for text in [path.read_text()] for match in BARE_IMPORT.finditer(text)]
    assert offenders == []


def test_installed_namespace_imports_and_bare_names_do_not(tmp_path):
    # Outside the repository, as a user's program: tidewater.* only.
    code = ("import importlib.util, tidewater.proto, tidewater.client.producer, "
            "tidewater.broker.replicas.replica_manager\n"
            f"print([n for n in {FOLDERS!r} if importlib.util.find_spec(n) is not None])")
    proc = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"


def test_importing_the_client_library_changes_nothing_process_wide(tmp_path):
    # No gRPC environment settings, no mallopt: those are programs' choices
    # (tidewater.proto.grpc_env, tidewater.proto.malloc_tuning).
    code = ("import os\nbefore = dict(os.environ)\n"
            "from tidewater.client.producer import Producer\n"
            "from tidewater.client.consumer import Consumer\n"
            "from tidewater.client.metadata import ChannelPool\n"
            "from tidewater.proto import malloc_tuning\n"
            "ChannelPool().close()\n"
            "import sys\n"
            "servers = [m for m in sys.modules if m.startswith(('tidewater.broker', "
            "'tidewater.controller', 'tidewater.tools'))]\n"
            "print(dict(os.environ) == before, malloc_tuning._applied, servers)")
    proc = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    # ... and it needs none of the servers' or the tools' code.
    assert proc.stdout.split() == ["True", "None", "[]"]


def test_test_modules_have_unique_basenames():
    """pytest imports the test files of folders without __init__.py by their basename: two
    of one name in different folders stop the whole collection ("import file mismatch")."""
    tests = Path(__file__).resolve().parents[1]
    seen: dict[str, Path] = {}
    for path in sorted(tests.rglob("test_*.py")):
        if (path.parent / "__init__.py").exists():
            continue  # a package's modules are imported by their dotted name
        other = seen.setdefault(path.name, path)
        assert other == path, f"{path} and {other} share a basename"
