"""``proto/crc.py``: the crc32c package's C function, loaded without the package's
``__init__`` (whose ``importlib.metadata.version`` call cost every broker start 7-9 ms)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import crc32c as packaged

from tidewater.proto import crc

IMPORT_ALONE = """
import json, sys
from tidewater.proto.crc import crc32c
print(json.dumps([type(crc32c).__name__, sorted(m for m in sys.modules
                  if m == "crc32c" or m.startswith(("crc32c.", "importlib.metadata")))]))
"""


def test_same_checksums_as_the_package() -> None:
    assert crc.crc32c(b"123456789") == 0xE3069283  # the CRC-32C check value
    for size in (0, 1, 7, 64, 4097, 40_000):  # 40,000: past the package's GIL release size
        data = os.urandom(size)
        assert crc.crc32c(data) == packaged.crc32c(data)
        assert crc.crc32c(memoryview(data)[1:]) == packaged.crc32c(data[1:])
        # Chained, as the batch and file checks continue a running value.
        assert crc.crc32c(data, crc.crc32c(b"head")) == packaged.crc32c(b"head" + data)


def test_loads_the_extension_without_the_package_or_importlib_metadata() -> None:
    done = subprocess.run([sys.executable, "-c", IMPORT_ALONE], check=True,
                          capture_output=True, text=True, timeout=60)
    kind, loaded = json.loads(done.stdout)
    assert kind == "builtin_function_or_method"
    assert loaded == []


PACKAGE_AFTER = """
import json
from tidewater.proto.crc import crc32c as ours
import crc32c
print(json.dumps([crc32c.__version__, crc32c.crc32c(b"x") == ours(b"x")]))
"""


def test_a_later_import_of_the_package_runs_as_always() -> None:
    done = subprocess.run([sys.executable, "-c", PACKAGE_AFTER], check=True,
                          capture_output=True, text=True, timeout=60)
    version, same = json.loads(done.stdout)
    assert version == packaged.__version__
    assert same is True


def test_the_holding_variant_never_releases_the_gil(monkeypatch) -> None:
    """The package would release it for 32 KiB or more, and the thread that did waits up to
    a switch interval to get it back while another thread runs Python (module docstring)."""
    calls = []

    def recording(data, value=0, gil_release_mode=-1):
        calls.append((len(data), value, gil_release_mode))
        return packaged.crc32c(data, value)

    monkeypatch.setattr(crc, "crc32c", recording)
    data = bytes(256 * 1024)
    assert crc.crc32c_holding_gil(data) == packaged.crc32c(data)
    assert crc.crc32c_holding_gil(data, 7) == packaged.crc32c(data, 7)
    assert calls == [(len(data), 0, 0), (len(data), 7, 0)]


def test_batches_are_built_holding_the_gil(monkeypatch) -> None:
    """The producer's I/O thread builds batches while the caller's thread sends."""
    from tidewater.proto import batch_builder

    modes = []
    monkeypatch.setattr(batch_builder, "crc32c_holding_gil",
                        lambda data, value=0: modes.append(len(data)) or crc.crc32c(data, value))
    builder = batch_builder.BatchBuilder()
    for _ in range(60):
        builder.append(None, bytes(1024), (), 0)
    built = builder.build(0)
    assert modes and modes[0] > 32 * 1024
    assert len(built) > 60 * 1024


def test_a_restamped_batch_gets_its_crc_holding_the_gil(monkeypatch) -> None:
    """A producer restamps a batch's producer fields on its I/O thread, as it builds one."""
    from tidewater.proto import batch, batch_builder

    builder = batch_builder.BatchBuilder()
    for _ in range(60):
        builder.append(None, bytes(1024), (), 0)
    built = bytearray(builder.build(0))
    sizes = []
    monkeypatch.setattr(batch, "crc32c_holding_gil",
                        lambda data, value=0: sizes.append(len(data)) or crc.crc32c(data, value))
    batch.set_producer_fields(built, 7, 1, 0)
    assert sizes and sizes[0] > 32 * 1024
    assert batch.batch_crc_valid(built)
