"""The audit package as a zip for ``spark-submit --py-files``.

The job imports itself as ``tidewater.audit`` (the installed namespace), so the
zip holds ``tidewater/audit/...`` with directory entries: Python's zipimport
finds the implicit namespace package ``tidewater`` only through its directory
entry. ``python -m tidewater.audit.pyfiles build/audit.zip`` (``make audit-zip``).
"""

from __future__ import annotations

import sys
import zipfile
from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parent


def build_zip(target: Path) -> Path:
    """Write the zip at ``target`` (parents created); returns ``target``."""
    target.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(target, "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr(zipfile.ZipInfo("tidewater/"), b"")
        z.writestr(zipfile.ZipInfo("tidewater/audit/"), b"")
        for path in sorted(PACKAGE_DIR.rglob("*")):
            relative = path.relative_to(PACKAGE_DIR)
            if "__pycache__" in relative.parts:
                continue
            name = "tidewater/audit/" + relative.as_posix()
            if path.is_dir():
                z.writestr(zipfile.ZipInfo(name + "/"), b"")
            else:
                z.write(path, name)
    return target


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m tidewater.audit.pyfiles OUT.zip", file=sys.stderr)
        return 2
    print(build_zip(Path(args[0])))
    return 0


if __name__ == "__main__":
    sys.exit(main())
