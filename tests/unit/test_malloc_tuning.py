"""proto.malloc_tuning: glibc accepts the large-buffer thresholds, once per process."""

import platform

import pytest

from tidewater.proto import malloc_tuning


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="thresholds exist only in glibc")
def test_glibc_accepts_the_thresholds_and_a_second_call_is_a_no_op(monkeypatch):
    monkeypatch.setattr(malloc_tuning, "_applied", None)
    assert malloc_tuning.tune_malloc_for_large_buffers() is True
    calls = []
    monkeypatch.setattr(malloc_tuning.ctypes, "CDLL", lambda *a: calls.append(a))
    assert malloc_tuning.tune_malloc_for_large_buffers() is True
    assert calls == []  # remembered, not applied again


def test_without_a_c_library_nothing_is_tuned(monkeypatch):
    monkeypatch.setattr(malloc_tuning, "_applied", None)

    def missing(*_args):
        raise OSError("no libc here")

    monkeypatch.setattr(malloc_tuning.ctypes, "CDLL", missing)
    assert malloc_tuning.tune_malloc_for_large_buffers() is False
    monkeypatch.setattr(malloc_tuning, "_applied", None)
