"""``tls_receive_paths``'s OpenSSL knobs: the ``SSL_CTX`` found under an ``SSLContext``
through ``ctypes`` is the live one (a wrong pointer would read garbage or crash), and the
kTLS option bit lands in the context's options."""

from __future__ import annotations

import ssl
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench.probes import tls_receive_paths as paths


@pytest.mark.timeout(10)
def test_read_ahead_is_set_on_this_context_only() -> None:
    tuned = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    untouched = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    paths.set_read_ahead_big_buffer(tuned)

    def read_ahead(context: ssl.SSLContext) -> int:
        return int(paths._LIBSSL.SSL_CTX_ctrl(paths.ssl_ctx_pointer(context),
                                              paths.SSL_CTRL_GET_READ_AHEAD, 0, None))

    assert read_ahead(tuned) == 1
    assert read_ahead(untouched) == 0


@pytest.mark.timeout(10)
def test_ktls_option_bit() -> None:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    assert not context.options & paths.SSL_OP_ENABLE_KTLS
    paths.set_ktls(context)
    assert context.options & paths.SSL_OP_ENABLE_KTLS


@pytest.mark.timeout(10)
def test_kernel_tls_answers() -> None:
    answer = paths.kernel_tls()
    assert answer is None or answer.startswith("no ")
