"""What the listener's decrypt costs per TLS record size: ``ssl.SSLObject.read`` (the call
uvloop's SSL protocol makes for each record) over memory BIOs in one process, no sockets,
TLS 1.3 with the cluster's kind of certificate.

    .venv/bin/python bench/probes/tls_record_decrypt.py [--mib 64]

Rows: records of 16 KiB (a sender that writes large buffers), of 1 KiB, and 1 KiB and
9 B alternating: librdkafka's pattern under TLS (one record per buffer segment: a 1 KiB
payload, then the next record's header) at its worst, every payload a segment of its own
(in a traced run ~3/4 of them were, 708 records per MB). Prints CPU ms per MB of plaintext and us per record.
"""

from __future__ import annotations

import argparse
import os
import ssl
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench.bench_common import format_table
from bench.probes.tls_receive_floor import server_context

READ_BUFFER_BYTES = 256 * 1024
PATTERNS = {"16 KiB records": (16384,), "1 KiB records": (1024,),
            "1 KiB + 9 B records in turn": (1024, 9)}


def handshake_pair(server_ssl: ssl.SSLContext, client_ssl: ssl.SSLContext,
                   ) -> tuple[ssl.SSLObject, ssl.SSLObject, list[ssl.MemoryBIO]]:
    """A server and a client ``SSLObject`` over memory BIOs, their handshake done, and the
    BIOs (server in, server out, client in, client out)."""
    bios = [ssl.MemoryBIO() for _ in range(4)]
    server_in, server_out, client_in, client_out = bios
    server = server_ssl.wrap_bio(server_in, server_out, server_side=True)
    client = client_ssl.wrap_bio(client_in, client_out, server_hostname="localhost")
    for _ in range(10):
        for side in (client, server):
            try:
                side.do_handshake()
            except ssl.SSLWantReadError:
                pass
        server_in.write(client_out.read())
        client_in.write(server_out.read())
    return server, client, bios


def connected_pair(directory: Path, tune: Callable[[ssl.SSLContext], None] | None = None,
                   ) -> tuple[ssl.SSLObject, ssl.MemoryBIO, ssl.SSLObject, ssl.MemoryBIO]:
    """(server, its incoming BIO, client, its outgoing BIO), handshake done; ``tune``
    (when given) changes the server's context first."""
    server_ssl, ca_file = server_context(directory)
    if tune is not None:
        tune(server_ssl)
    server, client, bios = handshake_pair(server_ssl, ssl.create_default_context(cafile=ca_file))
    return server, bios[0], client, bios[3]


def measure(directory: Path, sizes: tuple[int, ...], total_bytes: int,
            tune: Callable[[ssl.SSLContext], None] | None = None) -> tuple[float, float]:
    """(CPU ms per MB of plaintext, us per ``read`` call: per record when OpenSSL hands one
    record a call) of reading ``total_bytes`` sent as records of ``sizes`` in turn, the
    server's context changed by ``tune`` when given."""
    server, server_in, client, client_out = connected_pair(directory, tune)
    payloads = [os.urandom(size) for size in sizes]
    written = 0
    while written < total_bytes:
        for payload in payloads:
            client.write(payload)
            written += len(payload)
    server_in.write(client_out.read())
    view = memoryview(bytearray(READ_BUFFER_BYTES))
    read = server.read
    records = received = 0
    start = time.process_time()
    while received < written:
        received += read(READ_BUFFER_BYTES, view)
        records += 1
    seconds = time.process_time() - start
    return seconds * 1e3 / (received / 1e6), seconds * 1e6 / records


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mib", type=int, default=64)
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory(prefix="tls-record-decrypt-") as tmp:
        for label, sizes in PATTERNS.items():
            ms_per_mb, us_per_record = measure(Path(tmp), sizes, args.mib * 1024 * 1024)
            rows.append([label, f"{ms_per_mb:.3f}", f"{us_per_record:.2f}"])
    print(f"{args.mib} MiB per row, {ssl.OPENSSL_VERSION}")
    print(format_table(["records", "CPU ms/MB", "us/record"], rows, [False, True, True]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
