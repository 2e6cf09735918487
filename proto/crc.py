"""CRC-32C (Castagnoli), the checksum of RecordBatch v2 and of Tidewater's own files: the
``crc32c`` package's C function, loaded without running the package's ``__init__``.

Why: ``crc32c/__init__.py`` sets ``__version__`` by ``importlib.metadata.version``, which
imports ``importlib.metadata`` and scans the installed distributions: 7-9 ms of CPU after
the rest of a broker's imports (14-16 ms after asyncio, grpc and the protobuf stubs
alone), against 0.4 ms for the package's extension module alone (measured on a dev venv,
2-core machine), and every broker start paid it before serving (issue 30). The function is
the one the package exports (``crc32c._crc32c.crc32c``). The extension is loaded from the
package's own directory and not put in ``sys.modules``: a later ``import crc32c`` (tests,
the controller) runs exactly as before. Any other layout of the package: its import.

``crc32c`` is the package's function: it releases the GIL for data of 32 KiB or more.
``crc32c_holding_gil`` never does (``gil_release_mode`` 0), for a thread that others wait
on. A CRC of 200 KiB takes ~7 us, but the thread that released the GIL must then win it
back, and while another thread of the process is busy with Python that takes up to a
switch interval (5 ms). The threaded ``Producer``'s I/O thread paid that on every batch
it built past 32 KiB while the caller's thread kept sending: an idempotent producer's
batches grow to ~200 KiB (``client/producer.py``), and its rounds took 40-140 ms instead
of ~20 while the caller sent. Where the checking thread is not the one others wait on
(the ``Consumer`` checking fetched batches) the release lets the other threads run
beside the CRC: holding the GIL there read 3-10% slower (docs/benchmarks.md, 2026-12-02).
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import os
from collections.abc import Callable
from typing import TYPE_CHECKING

EXTENSION = "crc32c._crc32c"


def _extension_crc32c() -> Callable[..., int] | None:
    """``crc32c._crc32c.crc32c`` loaded by path, or None where it is not found."""
    package = importlib.util.find_spec("crc32c")  # top-level: finds, runs no __init__
    if package is None or not package.submodule_search_locations:
        return None
    for directory in package.submodule_search_locations:
        for suffix in importlib.machinery.EXTENSION_SUFFIXES:
            path = os.path.join(directory, "_crc32c" + suffix)
            if not os.path.isfile(path):
                continue
            loader = importlib.machinery.ExtensionFileLoader(EXTENSION, path)
            spec = importlib.util.spec_from_file_location(EXTENSION, path, loader=loader)
            if spec is None:
                return None
            module = importlib.util.module_from_spec(spec)
            loader.exec_module(module)
            function: Callable[..., int] = module.crc32c
            return function
    return None


if TYPE_CHECKING:
    from crc32c import crc32c as crc32c
else:
    crc32c = _extension_crc32c()
    if crc32c is None:
        from crc32c import crc32c

NEVER_RELEASE_GIL = 0


def crc32c_holding_gil(data: bytes | bytearray | memoryview, value: int = 0) -> int:
    """``crc32c`` without releasing the GIL, whatever the size (module docstring)."""
    return crc32c(data, value, NEVER_RELEASE_GIL)
