"""Which TLS receive path is cheapest for librdkafka's record pattern: the server's CPU per MB
received over each path a Python listener could use, with the same sender as
``tls_receive_floor.py`` (another process; 256 KiB chunks written ``--write-bytes`` at a time
with TCP_NODELAY, so with the default 1,046 B every write is one TLS record, as librdkafka
writes a produce request under TLS).

    .venv/bin/python bench/probes/tls_receive_paths.py [--mib 256] [--rounds 2]
                                                       [--write-bytes 1046]

Paths (rows), alternated ``--rounds`` times:

- ``uvloop``: uvloop's SSL protocol (memory BIOs) into a 1 MiB ``BufferedProtocol`` buffer,
  the listener's path today and ``tls_receive_floor.py``'s server;
- ``asyncio``: the same server on the stdlib event loop (its own memory-BIO SSL protocol);
- ``thread``: a blocking ``ssl.SSLSocket`` (a socket BIO: OpenSSL reads the socket itself)
  in a thread, ``recv_into`` a 1 MiB buffer; ``+read_ahead`` sets OpenSSL's read-ahead (the
  socket is read in large pieces instead of a record header and then its body), and
  ``+read_ahead+256K`` also makes its read buffer 256 KiB. Python has no setter for either:
  they go through ``ctypes`` to the ``SSL_CTX`` under the ``SSLContext``;
- ``thread+kTLS``: the same with ``SSL_OP_ENABLE_KTLS`` (option bit 1 << 3, no constant in
  Python 3.11's ``ssl``), only when the kernel has TLS (``/proc/net/tls_stat``); the row says
  how many kernel TLS receive contexts the run opened.
Each path also runs plaintext (``uvloop``, ``thread``) as a reference.

A second table is the in-memory decrypt (``tls_record_decrypt.py``'s ``SSLObject.read``,
1 KiB records) with the same knobs, to see whether any makes OpenSSL hand more than one
record per ``read`` call: it prints plaintext bytes per call.
"""

from __future__ import annotations

import _ssl
import argparse
import asyncio
import ctypes
import math
import socket
import ssl
import sys
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import uvloop

from bench.bench_common import KIB, format_table, median
from bench.probes import tls_receive_floor, tls_record_decrypt

RECEIVE_BUFFER_BYTES = 1024 * KIB  # as the floor's larger row
OPENSSL_READ_BUFFER_BYTES = 256 * KIB  # one produce request
SSL_OP_ENABLE_KTLS = 1 << 3  # OpenSSL 3's option bit; Python 3.11 names no constant
SSL_CTRL_GET_READ_AHEAD = 40
SSL_CTRL_SET_READ_AHEAD = 41
SSL_CTRL_SET_MAX_PIPELINES = 126
TLS_STAT_PATH = Path("/proc/net/tls_stat")
TCP_ULP = 31  # linux/tcp.h; Python's socket module has no constant for it

# The libssl ``_ssl`` itself is linked against (dlsym on its handle searches its
# dependencies), so the SSL_CTX pointers below belong to the same library.
_LIBSSL = ctypes.CDLL(_ssl.__file__)
_LIBSSL.SSL_CTX_ctrl.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_long, ctypes.c_void_p]
_LIBSSL.SSL_CTX_ctrl.restype = ctypes.c_long
_LIBSSL.SSL_CTX_set_default_read_buffer_len.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
_LIBSSL.SSL_CTX_set_default_read_buffer_len.restype = None


def ssl_ctx_pointer(context: ssl.SSLContext) -> int:
    """The ``SSL_CTX *`` of ``context``: CPython's ``PySSLContext`` holds it first after
    the object header."""
    pointer = ctypes.c_void_p.from_address(id(context) + object.__basicsize__).value
    assert pointer, "no SSL_CTX under this SSLContext"
    return pointer


def set_read_ahead(context: ssl.SSLContext) -> None:
    pointer = ssl_ctx_pointer(context)
    _LIBSSL.SSL_CTX_ctrl(pointer, SSL_CTRL_SET_READ_AHEAD, 1, None)
    assert _LIBSSL.SSL_CTX_ctrl(pointer, SSL_CTRL_GET_READ_AHEAD, 0, None) == 1


def set_read_ahead_big_buffer(context: ssl.SSLContext) -> None:
    set_read_ahead(context)
    _LIBSSL.SSL_CTX_set_default_read_buffer_len(ssl_ctx_pointer(context),
                                                OPENSSL_READ_BUFFER_BYTES)


def set_pipelines(context: ssl.SSLContext) -> None:
    """Read-ahead, a 256 KiB read buffer and up to 32 records per read: OpenSSL 3.0 reads
    several records in one go only with pipelining (and a cipher that allows it)."""
    set_read_ahead_big_buffer(context)
    _LIBSSL.SSL_CTX_ctrl(ssl_ctx_pointer(context), SSL_CTRL_SET_MAX_PIPELINES, 32, None)


def set_ktls(context: ssl.SSLContext) -> None:
    context.options |= SSL_OP_ENABLE_KTLS  # type: ignore[assignment]


def kernel_tls() -> str | None:
    """None when this kernel can do TLS on a socket; otherwise why not."""
    if TLS_STAT_PATH.exists():
        return None
    listener = socket.create_server(("127.0.0.1", 0))
    with listener, socket.create_connection(listener.getsockname()) as client:
        try:
            client.setsockopt(socket.IPPROTO_TCP, TCP_ULP, b"tls")
        except OSError as error:
            return f"no {TLS_STAT_PATH}; setsockopt(TCP_ULP, 'tls'): {error.strerror}"
    return f"no {TLS_STAT_PATH}, though the TLS ULP attached"


def tls_stat() -> dict[str, int]:
    if not TLS_STAT_PATH.exists():
        return {}
    return {name: int(value) for name, value in
            (line.split() for line in TLS_STAT_PATH.read_text().splitlines())}


async def measure_thread(context: ssl.SSLContext | None, ca_file: str | None,
                         total_bytes: int, write_bytes: int) -> tuple[float, float, float]:
    """A blocking socket (``SSLSocket`` when ``context``) read in a thread with
    ``recv_into``: (MB/s, this process's CPU ms per MB, bytes per ``recv_into`` call)."""
    loop = asyncio.get_running_loop()
    done = loop.create_future()
    counts = [0, 0]  # bytes received, recv_into calls
    listener = socket.create_server(("127.0.0.1", 0))

    def finish() -> None:
        if not done.done():
            done.set_result(None)

    def serve() -> None:
        connection, _ = listener.accept()
        try:
            if context is not None:
                connection = context.wrap_socket(connection, server_side=True)
            view = memoryview(bytearray(RECEIVE_BUFFER_BYTES))
            while counts[0] < total_bytes:
                nbytes = connection.recv_into(view)
                if not nbytes:
                    break
                counts[0] += nbytes
                counts[1] += 1
        except OSError:  # the sender gone (ssl.SSLError is an OSError)
            pass
        finally:
            connection.close()
            loop.call_soon_threadsafe(finish)

    thread = threading.Thread(target=serve, name="tls-receive-path", daemon=True)
    thread.start()
    at_start = [0, 0]
    try:
        elapsed, _, cpu = await tls_receive_floor.timed_transfer(
            listener.getsockname()[1], ca_file, total_bytes, lambda: counts[0] > 0,
            lambda: at_start.__setitem__(slice(None), list(counts)), done,
            write_bytes=write_bytes)
    finally:
        listener.close()
        thread.join(timeout=30)
    megabytes = (counts[0] - at_start[0]) / 1e6
    return (megabytes / elapsed, cpu * 1e3 / megabytes,
            (counts[0] - at_start[0]) / max(1, counts[1] - at_start[1]))


def floor_run(runner: Callable) -> Callable:
    """A path through ``tls_receive_floor.measure`` (the floor's server) on ``runner``'s
    loop; bytes per call are not counted there."""
    def run(context: ssl.SSLContext | None, ca_file: str | None, total_bytes: int,
            write_bytes: int) -> tuple[float, float, float]:
        mb_per_s, _, cpu_ms_per_mb = runner(tls_receive_floor.measure(
            context, ca_file, RECEIVE_BUFFER_BYTES, total_bytes, write_bytes))
        return mb_per_s, cpu_ms_per_mb, float("nan")
    return run


def thread_run(context: ssl.SSLContext | None, ca_file: str | None, total_bytes: int,
               write_bytes: int) -> tuple[float, float, float]:
    return asyncio.run(measure_thread(context, ca_file, total_bytes, write_bytes))


# (row label, runner, TLS?, context tuning)
PATHS: list[tuple[str, Callable, bool, Callable[[ssl.SSLContext], None] | None]] = [
    ("uvloop plaintext", floor_run(uvloop.run), False, None),
    ("uvloop TLS (today)", floor_run(uvloop.run), True, None),
    ("asyncio TLS", floor_run(asyncio.run), True, None),
    ("thread plaintext", thread_run, False, None),
    ("thread TLS", thread_run, True, None),
    ("thread TLS +read_ahead", thread_run, True, set_read_ahead),
    ("thread TLS +read_ahead+256K", thread_run, True, set_read_ahead_big_buffer),
]
KTLS_PATH = ("thread TLS +kTLS", thread_run, True, set_ktls)
DECRYPT_KNOBS: dict[str, Callable[[ssl.SSLContext], None] | None] = {
    "none": None, "read_ahead": set_read_ahead, "read_ahead + 256 KiB buffer":
    set_read_ahead_big_buffer, "read_ahead + 256 KiB + 32 pipelines": set_pipelines,
}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mib", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--write-bytes", type=int, default=1046,
                        help="the sender's write size (1046: librdkafka's records under TLS)")
    args = parser.parse_args()
    total_bytes = args.mib * 1024 * KIB
    no_ktls = kernel_tls()
    paths = PATHS + ([KTLS_PATH] if no_ktls is None else [])
    runs: dict[str, list[tuple[float, ...]]] = {}
    with tempfile.TemporaryDirectory(prefix="tls-paths-") as tmp:
        for round_index in range(args.rounds):
            for index, (label, run, tls, tune) in enumerate(paths):
                context: ssl.SSLContext | None = None
                ca_file: str | None = None
                if tls:  # a context of its own: the knobs stay on their row
                    directory = Path(tmp) / f"{round_index}-{index}"
                    directory.mkdir()
                    context, ca_file = tls_receive_floor.server_context(directory)
                    if tune is not None:
                        tune(context)
                stat_before = tls_stat()
                result = run(context, ca_file, total_bytes, args.write_bytes)
                stat_after = tls_stat()
                rx_opened = (stat_after.get("TlsRxSw", 0) + stat_after.get("TlsRxDevice", 0)
                             - stat_before.get("TlsRxSw", 0)
                             - stat_before.get("TlsRxDevice", 0))
                runs.setdefault(label, []).append((*result, rx_opened))
        decrypt_rows = []
        for label, tune in DECRYPT_KNOBS.items():
            ms_per_mb, us_per_call = tls_record_decrypt.measure(
                Path(tmp), (1024,), 64 * 1024 * KIB, tune)
            # us/call over ms/MB is (bytes / calls) / 1e3
            decrypt_rows.append([label, f"{ms_per_mb:.3f}",
                                 f"{1e3 * us_per_call / ms_per_mb:,.0f}"])
    rows = [[label, f"{median([r[0] for r in measured]):,.0f}",
             f"{median([r[1] for r in measured]):.2f}",
             "-" if math.isnan(measured[0][2]) else f"{median([r[2] for r in measured]):,.0f}",
             "-" if no_ktls else str(int(median([r[3] for r in measured])))]
            for label, measured in runs.items()]
    print(f"{args.mib} MiB per run from another process in {args.write_bytes:,} B writes, "
          f"uvloop {uvloop.__version__}, {ssl.OPENSSL_VERSION}; medians of {args.rounds}")
    print(f"kernel TLS: {'available' if no_ktls is None else 'unavailable: ' + no_ktls}")
    print(format_table(["path", "MB/s", "server CPU ms/MB", "bytes per recv_into",
                        "kTLS RX contexts"], rows))
    print()
    print("in-memory decrypt (SSLObject.read, 1 KiB records, 64 MiB) by OpenSSL knob")
    print(format_table(["knobs", "CPU ms/MB", "plaintext bytes per read"], decrypt_rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
