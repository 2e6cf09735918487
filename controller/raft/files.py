"""What the Raft files share: the corruption error and the atomic replace."""

from __future__ import annotations

import os
from pathlib import Path

from tidewater.proto.errors import CorruptFileError

TMP_SUFFIX = ".tmp"


class CorruptRaftFileError(CorruptFileError):
    """A Raft file is damaged in a way no crash explains: stop, do not guess."""

    def __init__(self, message: str, *, path: Path, position: int):
        super().__init__(f"{message} at byte {position}", path=str(path))
        self.position = position


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomically(path: Path, data: bytes) -> None:
    """Write ``.tmp``, fsync it, rename it over ``path``, fsync the directory: a crash
    leaves the old file or the new one, never a mix."""
    tmp = path.with_name(path.name + TMP_SUFFIX)
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fsync_dir(path.parent)
