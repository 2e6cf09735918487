"""The floor of TLS on the Kafka listener's read path, and whether a socket-BIO writer
cuts the leader's share of it.

    .venv/bin/python bench/probes/tls_answer_write.py [--answers 20] [--rounds 3]
        [--paths PATH ...] [--tls-piece-kib KIB ...]

Two parts, both printed as tables:

1. In memory (no sockets): CPU ms per MB to encrypt and to decrypt 16 KiB TLS records
   through Python's ``ssl`` with memory BIOs (``SSLObject``, one ``write`` of 256 KiB
   then one BIO ``read``, as uvloop's SSL transport does), after a real handshake with
   the listener's context (``proto/tls.server_ssl_context``).
2. A server in this process writes ``--answers`` answers of 12 MB (a Fetch answer's
   size on the read bench) to a reader in another process (a blocking ``SSLSocket``,
   ``recv_into`` a 1 MiB buffer; it asks for the next answer after the last byte of
   one, as librdkafka's one fetch in flight). Paths, alternated ``--rounds`` times:
   ``uvloop plaintext``; ``uvloop TLS`` (the listener today: ``writelines`` of 256 KiB,
   each drained, through uvloop's memory-BIO SSL transport); ``socket-BIO TLS`` (a
   non-blocking ``ssl.SSLSocket`` on the loop through ``add_reader``/``add_writer``:
   OpenSSL writes records straight to the socket, no BIO copies). Server CPU ms per MB
   (``os.times``, this process only, from the second ask to the reader's exit) and MB/s;
   then per answer the first-byte delay and how much of the server's window (ask read to
   last byte handed on) the reader spends receiving, on one monotonic clock.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import multiprocessing
import os
import socket
import ssl
import sys
import tempfile
import time
from pathlib import Path
from typing import NamedTuple

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import uvloop

from bench.bench_common import KIB, format_table, median, stop_child
from bench.probes.tls_record_decrypt import handshake_pair
from tidewater.proto.tls import TlsFiles, server_ssl_context
from tidewater.tools import certs

ANSWER_BYTES = 12 * 1000 * 1000
PIECE_BYTES = 256 * KIB  # the listener's drained writelines under TLS (framing.write_parts)
RECORD_BYTES = 16 * KIB
READ_BUFFER_BYTES = 1024 * KIB


def write_files(directory: Path) -> TlsFiles:
    now = datetime.datetime.now(datetime.UTC)
    ca = certs.make_ca(now=now)
    broker = certs.issue(ca, name="broker-1", role="broker", now=now)
    files = TlsFiles(ca=directory / "ca.pem", cert=directory / "cert.pem",
                     key=directory / "key.pem")
    assert files.cert is not None and files.key is not None
    files.ca.write_bytes(ca.cert_pem)
    files.cert.write_bytes(broker.cert_pem)
    files.key.write_bytes(broker.key_pem)
    return files


def client_context(ca_file: Path) -> ssl.SSLContext:
    return ssl.create_default_context(cafile=str(ca_file))


# ---------------------------------------------------------------- 1. in memory


def memory_pair(files: TlsFiles) -> tuple[ssl.SSLObject, ssl.SSLObject, list[ssl.MemoryBIO]]:
    """A server (the listener's context) and a client ``SSLObject`` after their handshake,
    and their BIOs (server in, server out, client in, client out)."""
    return handshake_pair(server_ssl_context(files), client_context(files.ca))


def in_memory(files: TlsFiles, megabytes: int) -> tuple[str, float, float, str]:
    """(cipher, encrypt CPU ms/MB, decrypt CPU ms/MB, records per MB) at 16 KiB
    records: the server encrypts, the client decrypts."""
    server, client, bios = memory_pair(files)
    piece = os.urandom(PIECE_BYTES)
    pieces = megabytes * 1_000_000 // PIECE_BYTES
    sink = bytearray(READ_BUFFER_BYTES)
    encrypt_s = decrypt_s = 0.0
    wire_bytes = 0
    # Each piece is decrypted before the next is encrypted: the BIO's bytes are freed and
    # reused, as in a transport (holding them all faults in fresh pages on every read).
    for _ in range(pieces):
        start = time.process_time()
        server.write(piece)
        encrypted = bios[1].read()
        middle = time.process_time()
        bios[2].write(encrypted)
        while True:
            try:
                if not client.read(len(sink), sink):
                    break
            except ssl.SSLWantReadError:
                break
        encrypt_s += middle - start
        decrypt_s += time.process_time() - middle
        wire_bytes += len(encrypted)
    mb = pieces * PIECE_BYTES / 1e6
    records_per_mb = (wire_bytes - pieces * PIECE_BYTES) / 22 / mb  # 22 B overhead per record
    cipher = server.cipher()
    return (f"{server.version()} {cipher[0] if cipher else '?'}", 1e3 * encrypt_s / mb,
            1e3 * decrypt_s / mb, f"{records_per_mb:.0f}")


# ---------------------------------------------------------------- 2. over a socket


def read_answers(port: int, ca_file: str | None, answers: int, times_file: str) -> None:
    """In a process of its own: ask for ``answers`` answers one at a time (one byte out,
    ``ANSWER_BYTES`` in), as a reader with one fetch in flight; writes each answer's
    first and last byte's ``perf_counter`` (CLOCK_MONOTONIC, shared with the server) to
    ``times_file``."""
    sock: socket.socket = socket.create_connection(("127.0.0.1", port))
    if ca_file is not None:
        sock = client_context(Path(ca_file)).wrap_socket(sock, server_hostname="localhost")
    buffer = memoryview(bytearray(READ_BUFFER_BYTES))
    sock.sendall(b"w")  # warm-up answer: past the handshake and first allocations
    times: list[str] = []
    for index in range(answers + 1):
        received = 0
        first = 0.0
        while received < ANSWER_BYTES:
            n = sock.recv_into(buffer)
            if not n:
                raise ConnectionError("server closed mid-answer")
            if not received:
                first = time.perf_counter()
            received += n
        times.append(f"{first} {time.perf_counter()}")
        if index < answers:
            sock.sendall(b"a")
    sock.close()
    Path(times_file).write_text("\n".join(times[1:]))  # the warm-up answer left out


class AnswerServer:
    """Counts answers; each ask (one byte) is answered with ``ANSWER_BYTES``."""

    def ask(self) -> float:
        """One ask read: its time."""
        self.asked += 1
        now = time.perf_counter()
        if self.asked == 2:
            self.cpu_start, self.start_s = os.times(), now
            self.started.set()
        return now

    def __init__(self) -> None:
        self.answer = memoryview(os.urandom(ANSWER_BYTES))
        self.asked = 0
        # the second ask (the warm-up answer is through): where the timing starts, taken
        # in the serving code itself (a polling task can be late by several answers)
        self.started = asyncio.Event()
        self.start_s = 0.0
        self.cpu_start: os.times_result | None = None
        # per answer: (ask read, last byte handed to the transport or the socket)
        self.windows: list[tuple[float, float]] = []


async def serve_uvloop(stream_reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                       state: AnswerServer, tls: bool, piece_bytes: int = PIECE_BYTES) -> None:
    while await stream_reader.read(1):
        asked_at = state.ask()
        if tls:  # as framing.write_parts under TLS: 256 KiB writelines, each drained
            for offset in range(0, ANSWER_BYTES, piece_bytes):
                writer.writelines([state.answer[offset:offset + piece_bytes]])
                await writer.drain()
        else:
            writer.writelines([state.answer])
            await writer.drain()
        state.windows.append((asked_at, time.perf_counter()))
    writer.close()


async def wait_io(loop: asyncio.AbstractEventLoop, sock: ssl.SSLSocket, write: bool) -> None:
    ready = loop.create_future()
    add, remove = ((loop.add_writer, loop.remove_writer) if write
                   else (loop.add_reader, loop.remove_reader))
    add(sock.fileno(), ready.set_result, None)
    try:
        await ready
    finally:
        remove(sock.fileno())


async def call(loop: asyncio.AbstractEventLoop, sock: ssl.SSLSocket, op, *args):  # type: ignore[no-untyped-def]
    """``op(*args)`` on a non-blocking SSLSocket, waiting on whichever way OpenSSL asks
    (a TLS write can need a read, and a read a write, e.g. around a KeyUpdate)."""
    while True:
        try:
            return op(*args)
        except ssl.SSLWantReadError:
            await wait_io(loop, sock, write=False)
        except ssl.SSLWantWriteError:
            await wait_io(loop, sock, write=True)


async def serve_socket_bio(raw: socket.socket, context: ssl.SSLContext,
                           state: AnswerServer) -> None:
    loop = asyncio.get_running_loop()
    raw.setblocking(False)
    raw.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # as uvloop's transports
    sock = context.wrap_socket(raw, server_side=True, do_handshake_on_connect=False)
    await call(loop, sock, sock.do_handshake)
    try:
        while await call(loop, sock, sock.recv, 1):
            asked_at = state.ask()
            view = state.answer
            while view:
                # SSL_write without partial writes: a retry after WANT_WRITE passes the
                # same piece; CPython allows the buffer to move.
                sent = await call(loop, sock, sock.send, view[:PIECE_BYTES])
                view = view[sent:]
            state.windows.append((asked_at, time.perf_counter()))
    except (ssl.SSLEOFError, ConnectionError):
        pass
    finally:
        sock.close()


class Measured(NamedTuple):
    mb_per_s: float
    server_cpu_ms_per_mb: float
    first_byte_ms: float  # median, from the server reading the ask to the reader's first byte
    server_ms: float  # median, from the ask read to the last byte handed on
    reader_ms: float  # median, from the reader's first byte to its last
    overlap: float  # median share of the server's window during which the reader receives


def overlaps(server: list[tuple[float, float]], reader: list[tuple[float, float]]
             ) -> tuple[float, float, float, float]:
    """Medians over answers: (first-byte delay ms, server window ms, reader window ms,
    share of the server's window the reader's overlaps)."""
    pairs = list(zip(server, reader, strict=True))
    return (median([1e3 * (r[0] - s[0]) for s, r in pairs]),
            median([1e3 * (s[1] - s[0]) for s, _ in pairs]),
            median([1e3 * (r[1] - r[0]) for _, r in pairs]),
            median([max(0.0, min(s[1], r[1]) - max(s[0], r[0])) / (s[1] - s[0])
                    for s, r in pairs]))


async def measure(path: str, context: ssl.SSLContext, ca_file: str,
                  answers: int, times_file: Path) -> Measured:
    """Over ``answers`` answers after a warm-up one."""
    loop = asyncio.get_running_loop()
    state = AnswerServer()
    tasks: list[asyncio.Task] = []
    if path == "socket-BIO TLS":
        listener = socket.create_server(("127.0.0.1", 0))
        listener.setblocking(False)

        def accept() -> None:
            raw, _ = listener.accept()
            tasks.append(loop.create_task(serve_socket_bio(raw, context, state)))
        loop.add_reader(listener.fileno(), accept)
        port = listener.getsockname()[1]
        server = None
    else:
        tls = path.startswith("uvloop TLS")
        # "uvloop TLS <n> KiB": that piece size instead of the listener's
        piece_bytes = int(path.split()[2]) * KIB if path.endswith(" KiB") else PIECE_BYTES
        server = await asyncio.start_server(
            lambda r, w: serve_uvloop(r, w, state, tls, piece_bytes), "127.0.0.1", 0,
            ssl=context if tls else None)
        port = server.sockets[0].getsockname()[1]
    reader = multiprocessing.get_context("spawn").Process(
        target=read_answers, args=(port, None if path == "uvloop plaintext" else ca_file,
                                   answers, str(times_file)))
    reader.start()
    try:
        await state.started.wait()
        # a thread waits on the reader's exit: no polling counted in this process's CPU
        await loop.run_in_executor(None, reader.join)
        elapsed, cpu_after = time.perf_counter() - state.start_s, os.times()
        cpu_before = state.cpu_start
        assert cpu_before is not None  # set with ``started``
        if reader.exitcode != 0:  # a reader that died counts no answers: no figures
            raise RuntimeError(f"{path}: the reader exited with {reader.exitcode}")
    finally:
        stop_child(reader, join_timeout_s=30)
        if server is not None:
            server.close()
        else:
            loop.remove_reader(listener.fileno())
            listener.close()
        for task in tasks:
            task.cancel()
    # From the second ask to the reader's exit: ``answers`` answers (the last ask's included).
    mb = answers * ANSWER_BYTES / 1e6
    cpu = (cpu_after.user - cpu_before.user) + (cpu_after.system - cpu_before.system)
    reader_windows = [(float(a), float(b)) for a, b in
                      (line.split() for line in times_file.read_text().splitlines())]
    return Measured(mb / elapsed, 1e3 * cpu / mb,
                    *overlaps(state.windows[1:], reader_windows))


PATHS = ("uvloop plaintext", "uvloop TLS", "socket-BIO TLS")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--answers", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--memory-mb", type=int, default=256)
    parser.add_argument("--paths", nargs="+", choices=PATHS, default=PATHS)
    parser.add_argument("--tls-piece-kib", type=int, nargs="*", default=[],
                        help="also uvloop TLS with these drained piece sizes")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="tls-answer-") as tmp:
        files = write_files(Path(tmp))
        memory = [in_memory(files, args.memory_mb) for _ in range(args.rounds)]
        print(f"In memory, {ssl.OPENSSL_VERSION}, {memory[0][0]}, "
              f"{PIECE_BYTES // KIB} KiB writes, {memory[0][3]} records/MB:")
        print(format_table(["round", "encrypt CPU ms/MB", "decrypt CPU ms/MB"],
                           [[str(i), f"{m[1]:.3f}", f"{m[2]:.3f}"] for i, m in enumerate(memory)]))
        context = server_ssl_context(files)
        paths = [*args.paths, *(f"uvloop TLS {kib} KiB" for kib in args.tls_piece_kib)]
        runs: dict[str, list[Measured]] = {p: [] for p in paths}
        for _ in range(args.rounds):
            for path in paths:
                runs[path].append(uvloop.run(measure(path, context, str(files.ca), args.answers,
                                                     Path(tmp) / "times.txt")))
    print(f"\n{args.answers} answers of {ANSWER_BYTES / 1e6:.0f} MB per run, uvloop "
          f"{uvloop.__version__}; per round, then median:")
    print(format_table(["path", "MB/s", "server CPU ms/MB", "median MB/s", "median ms/MB"],
                       [[p, " ".join(f"{r[0]:.0f}" for r in rs), " ".join(f"{r[1]:.2f}" for r in rs),
                         f"{median([r[0] for r in rs]):.0f}", f"{median([r[1] for r in rs]):.2f}"]
                        for p, rs in runs.items()]))
    print("\nPer answer, medians over the answers of each round (ms; overlap: share of the "
          "server's window from the ask to its last byte during which the reader receives):")
    print(format_table(["path", "first byte ms", "server window ms", "reader window ms",
                        "overlap"],
                       [[p, " ".join(f"{r.first_byte_ms:.1f}" for r in rs),
                         " ".join(f"{r.server_ms:.1f}" for r in rs),
                         " ".join(f"{r.reader_ms:.1f}" for r in rs),
                         " ".join(f"{r.overlap:.2f}" for r in rs)] for p, rs in runs.items()]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
