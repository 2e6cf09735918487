"""The design's floor: an acks=all round at a paced rate with nothing but the messages.

    .venv/bin/python bench/probes/design_floor.py [--rate 1000] [--seconds 4] [--record-bytes 1024]
        [--repeats 3] [--storage] [--kafka [--kafka-answer-delay-ms 1]] [--cluster] [--mixed]
        [--peer]

Five processes on 127.0.0.1, as in ``latency_breakdown.py``'s run, each on uvloop with
``proto/grpc_env.py``'s settings: a leader, two followers (each also a grpc.aio server,
idle, as brokers are), a producer and a receiver. They exchange the messages a real
round exchanges, on the same RPC kinds, with the real protobuf messages:

- the producer: a pacer thread (``run_paced``, as the bench's) hands each stamped record
  to the producer's loop thread; one ``ProduceStream`` request in flight, records due
  meanwhile go together in the next one (the bench's Producer, linger 0);
- each follower long-polls the leader on a ``ReplicaFetch`` stream: its next fetch is
  sent as soon as the answer arrives and carries its new end;
- the leader keeps the records in one bytearray (no log, no checks, no batches), moves
  the HW when both followers' fetch offsets pass a record, then answers the produce
  request and the receiver's parked fetch;
- the receiver long-polls on a ``FetchStream`` (max wait 100 ms, as the bench's Consumer)
  and stamps each record's receipt in its loop thread (the real Consumer hands records to
  a polling thread: one wake-up more than here).

Prints e2e (due -> receipt) and ack (due -> answer) p50/p99 and each process's CPU per
round (one produce request). ``--cluster`` alternates each run with
``latency_breakdown.py`` (the real 3-broker cluster, same rate and seconds) and prints
both. ``--storage`` adds, after each floor run, the floor with the broker's own on-disk
``Log`` at each replica (``StoredLeaderState``: append, and reads with every batch's CRC
checked) and Kafka batches from the producer, checked by the receiver: the floor of a
replicated log of this format, before any of the broker around the log. ``--kafka`` adds
the same with librdkafka clients over ``floor_kafka``'s listener on the floor leader (the
bench's Kafka row, ``kafka_side.paced_latency``), then that row against the real cluster;
``--kafka-answer-delay-ms`` makes the floor's Produce answers later, to show how the
clients turn a longer round into e2e latency. ``--mixed`` adds, after each floor run, the
floor's producer and receiver against the real brokers (``run_mixed``). ``--peer`` alternates each run with JetStream's (``peer_nats.paced_latency`` on a
3-node NATS cluster started once, as ``cluster_bench`` runs it; needs nats-server and
nats-py), so the floor, the cluster and the peer stand in one table. What the real round has beyond this: the log, batch encoding and CRCs, the
checks, the replica state machine, the clients' batching and their extra threads.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import multiprocessing
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

PROJECT_DIR = Path(__file__).resolve().parents[2]
if str(PROJECT_DIR) not in sys.path:
    sys.path.insert(0, str(PROJECT_DIR))

from bench.bench_common import (  # noqa: E402
    OwnedProcesses,
    format_table,
    latency_summary,
    process_cpu_s,
    receiver_latencies,
)
from bench.probes.latency_probe import read_stamp, run_paced, stamped_payload  # noqa: E402

if TYPE_CHECKING:
    from bench.peer_nats import NatsCluster

PRODUCE_METHOD = "/tidewater.Broker/ProduceStream"
FETCH_METHOD = "/tidewater.Broker/FetchStream"
REPLICA_FETCH_METHOD = "/tidewater.BrokerControl/ReplicaFetch"
FOLLOWER_IDS = (2, 3)
FETCH_MAX_WAIT_MS = 100  # the bench's Consumer
REPLICA_MAX_WAIT_MS = 500
WARM_UP_RECORDS = 300


def _start_grpc() -> None:
    """Before grpc is imported in this (spawned) process: as Tidewater's programs do."""
    from tidewater.proto import grpc_env

    grpc_env.apply()


class Watermark:
    """An offset that only grows, and the futures waiting for it to pass a value."""

    def __init__(self) -> None:
        self.value = 0
        self._waiters: list[tuple[int, asyncio.Future[None]]] = []

    def advance(self, value: int) -> None:
        if value <= self.value:
            return
        self.value = value
        still = []
        for needed, future in self._waiters:
            if needed <= value:
                if not future.done():
                    future.set_result(None)
            else:
                still.append((needed, future))
        self._waiters = still

    async def wait_past(self, offset: int, timeout_s: float | None) -> None:
        """Until value > offset, or ``timeout_s`` has passed (then it just returns)."""
        if self.value > offset:
            return
        loop = asyncio.get_running_loop()
        future: asyncio.Future[None] = loop.create_future()
        self._waiters.append((offset + 1, future))
        timer = None if timeout_s is None else loop.call_later(
            timeout_s, lambda: future.done() or future.set_result(None))
        await future
        if timer is not None:
            timer.cancel()


class LeaderState:
    """Records in one bytearray; offsets count fixed-size records."""

    def __init__(self, record_bytes: int) -> None:
        self.record_bytes = record_bytes
        self.log = bytearray()
        self.end = Watermark()  # the log end offset
        self.high_watermark = Watermark()
        self.follower_ends = dict.fromkeys(FOLLOWER_IDS, 0)

    def append(self, records: bytes) -> int:
        base = self.end.value
        self.log += records
        self.end.advance(len(self.log) // self.record_bytes)
        return base

    def follower_at(self, follower_id: int, offset: int) -> None:
        self.follower_ends[follower_id] = offset
        self.high_watermark.advance(min(self.follower_ends.values()))

    def read(self, start: int, end: int) -> bytes:
        return bytes(self.log[start * self.record_bytes:end * self.record_bytes])


def _open_log(directory: str):
    """The broker's own on-disk ``Log`` (default LogConfig) in ``directory``/paced-0."""
    from tidewater.broker.storage.log import Log
    from tidewater.broker.storage.log_config import LogConfig

    return Log.open(Path(directory) / "paced-0", LogConfig(), now_ms=int(time.time() * 1000))


class StoredLeaderState(LeaderState):
    """``--storage``: the records in the broker's own ``Log``; offsets are Kafka offsets.

    What a replica of this log format cannot skip: ``append_as_leader`` (each batch's
    framing and CRC checked, offsets and the leader epoch stamped, written to the
    segment and its index) and ``Log.read`` (each batch's CRC checked again on the way
    out), nothing of the broker around them (no replica state machine, purgatory,
    metrics, quotas or checks of the request)."""

    def __init__(self, directory: str) -> None:
        super().__init__(record_bytes=1)
        self.stored = _open_log(directory)

    def append(self, records: bytes) -> int:
        base = self.stored.append_as_leader(records, 0, int(time.time() * 1000)).first_offset
        self.end.advance(self.stored.log_end_offset)
        return base

    def read(self, start: int, end: int) -> bytes:
        if start >= end:
            return b""
        return bytes(self.stored.read(start, 1 << 20, max_offset=end).records)


def _leader_main(port_pipe, record_bytes: int, storage_dir: str | None = None,
                 kafka_rounds=None, kafka_answer_delay_ms: float = 0.0) -> None:
    """With ``kafka_rounds`` (a shared counter of its Produce requests) the leader also
    serves the clients over ``floor_kafka``'s listener and sends (gRPC port, Kafka port)."""
    _start_grpc()
    import grpc
    import uvloop

    from tidewater.proto import tidewater_pb2 as pb

    state = LeaderState(record_bytes) if storage_dir is None else StoredLeaderState(storage_dir)

    async def produce_stream(_unused, context) -> None:
        while (request := await context.read()) is not grpc.aio.EOF:
            base = state.append(request.partitions[0].records)
            await state.high_watermark.wait_past(state.end.value - 1, None)
            await context.write(pb.ProduceResponse(
                correlation_id=request.correlation_id,
                partitions=[pb.ProducePartitionResponse(base_offset=base)]))

    async def replica_fetch(_unused, context) -> None:
        while (request := await context.read()) is not grpc.aio.EOF:
            offset = request.partitions[0].fetch_offset
            state.follower_at(request.replica_id, offset)
            await state.end.wait_past(offset, request.max_wait_ms / 1000)
            await context.write(pb.FetchResponse(partitions=[pb.FetchPartitionResponse(
                high_watermark=state.high_watermark.value,
                records=state.read(offset, state.end.value))]))

    async def fetch_stream(_unused, context) -> None:
        while (request := await context.read()) is not grpc.aio.EOF:
            offset = request.partitions[0].fetch_offset
            await state.high_watermark.wait_past(offset, request.max_wait_ms / 1000)
            hw = state.high_watermark.value
            await context.write(pb.FetchResponse(partitions=[pb.FetchPartitionResponse(
                high_watermark=hw, records=state.read(offset, hw))]))

    def stream(handler, request_type, response_type):
        return grpc.stream_stream_rpc_method_handler(
            handler, request_deserializer=request_type.FromString,
            response_serializer=response_type.SerializeToString)

    async def serve() -> None:
        server = grpc.aio.server()
        server.add_generic_rpc_handlers((
            grpc.method_handlers_generic_handler("tidewater.Broker", {
                "ProduceStream": stream(produce_stream, pb.ProduceRequest, pb.ProduceResponse),
                "FetchStream": stream(fetch_stream, pb.FetchRequest, pb.FetchResponse)}),
            grpc.method_handlers_generic_handler("tidewater.BrokerControl", {
                "ReplicaFetch": stream(replica_fetch, pb.FetchRequest, pb.FetchResponse)})))
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        if kafka_rounds is None:
            port_pipe.send(port)
        else:
            from bench.probes.floor_kafka import FloorKafkaServer

            kafka = FloorKafkaServer(state, "paced", on_produce=kafka_rounds,
                                     answer_delay_ms=kafka_answer_delay_ms)
            port_pipe.send((port, await kafka.start()))
        await server.wait_for_termination()

    uvloop.run(serve())


def _fetch_request(pb, replica_id: int, offset: int, max_wait_ms: int):
    return pb.FetchRequest(replica_id=replica_id, max_wait_ms=max_wait_ms, partitions=[
        pb.FetchPartition(topic="paced", partition=0, fetch_offset=offset)])


def _follower_main(port: int, follower_id: int, record_bytes: int,
                   storage_dir: str | None = None) -> None:
    _start_grpc()
    import grpc
    import uvloop

    from tidewater.proto import tidewater_pb2 as pb

    stored = None if storage_dir is None else _open_log(storage_dir)

    async def follow() -> None:
        server = grpc.aio.server()  # a broker serves; nothing calls it in the round
        server.add_insecure_port("127.0.0.1:0")
        await server.start()
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            call = channel.stream_stream(
                REPLICA_FETCH_METHOD, request_serializer=pb.FetchRequest.SerializeToString,
                response_deserializer=pb.FetchResponse.FromString)()
            offset = 0
            while True:
                await call.write(_fetch_request(pb, follower_id, offset, REPLICA_MAX_WAIT_MS))
                answer = await call.read()
                records = answer.partitions[0].records
                if stored is None:
                    offset += len(records) // record_bytes
                elif records:  # --storage: appended to its own Log, as a follower does
                    stored.append_as_follower(records, int(time.time() * 1000))
                    offset = stored.log_end_offset

    uvloop.run(follow())


def _receiver_main(address: str, record_bytes: int, expected: int, result_pipe,
                   kafka_batches: bool = False) -> None:
    _start_grpc()
    import grpc
    import uvloop

    from tidewater.proto import tidewater_pb2 as pb
    from tidewater.proto.batch import iter_batches
    from tidewater.proto.records import decode_batch_records

    def stamps(records: bytes) -> tuple[list[int], int]:
        """(each record's stamp, how many offsets ``records`` covers)."""
        if not kafka_batches:
            return ([read_stamp(records[start:start + 8]) for start in range(0, len(records), record_bytes)],
                    len(records) // record_bytes)
        found, covered = [], 0
        for position, header in iter_batches(records):  # each batch's CRC checked
            found.extend(read_stamp(r.value) for r in decode_batch_records(records, position, header))
            covered += header.last_offset_delta + 1
        return found, covered

    async def receive() -> list[float]:
        latencies_ms: list[float] = []
        async with grpc.aio.insecure_channel(address) as channel:
            call = channel.stream_stream(
                FETCH_METHOD, request_serializer=pb.FetchRequest.SerializeToString,
                response_deserializer=pb.FetchResponse.FromString)()
            offset = 0
            result_pipe.send("ready")
            while len(latencies_ms) < expected:
                await call.write(_fetch_request(pb, -1, offset, FETCH_MAX_WAIT_MS))
                records = (await call.read()).partitions[0].records
                now_ns = time.time_ns()
                sent_ns, covered = stamps(records)
                latencies_ms.extend((now_ns - stamp) / 1e6 for stamp in sent_ns)
                offset += covered
        return latencies_ms

    result_pipe.send(uvloop.run(receive()))


def _producer_main(address: str, record_bytes: int, count: int, rate_per_s: float, result_pipe,
                   kafka_batches: bool = False) -> None:
    _start_grpc()
    import grpc
    import uvloop

    from tidewater.proto import tidewater_pb2 as pb
    from tidewater.proto.records import encode_batch

    def records_of(payloads: list[bytes]) -> bytes:
        # the real leader takes Kafka batches (one per request, as the Producer's)
        return encode_batch([(None, p) for p in payloads]) if kafka_batches else b"".join(payloads)

    filler = os.urandom(record_bytes)

    async def produce() -> tuple[list[float], int, float]:
        loop = asyncio.get_running_loop()
        pending: list[tuple[bytes, int]] = []
        wake = asyncio.Event()
        ack_ms: list[float] = []
        requests = [0]

        def enqueue(payload: bytes, due_ns: int) -> None:
            pending.append((payload, due_ns))
            wake.set()

        async with grpc.aio.insecure_channel(address) as channel:
            call = channel.stream_stream(
                PRODUCE_METHOD, request_serializer=pb.ProduceRequest.SerializeToString,
                response_deserializer=pb.ProduceResponse.FromString)()

            async def send_loop() -> None:
                while True:
                    await wake.wait()
                    wake.clear()
                    batch = pending[:]
                    del pending[:]
                    requests[0] += 1
                    await call.write(pb.ProduceRequest(acks=-1, correlation_id=requests[0], partitions=[
                        pb.ProducePartitionData(topic="paced", partition=0,
                                                records=records_of([p for p, _ in batch]))]))
                    await call.read()
                    now_ns = time.time_ns()
                    ack_ms.extend((now_ns - due_ns) / 1e6 for _, due_ns in batch)

            sender = asyncio.ensure_future(send_loop())

            def pace(records: int, done: asyncio.Future) -> None:
                def send_one(_index: int, due_ns: int) -> None:
                    loop.call_soon_threadsafe(enqueue, stamped_payload(record_bytes, due_ns, filler), due_ns)

                rate = run_paced(records, rate_per_s, send_one)
                loop.call_soon_threadsafe(done.set_result, rate)

            async def paced(records: int) -> float:
                done = loop.create_future()
                threading.Thread(target=pace, args=(records, done), daemon=True).start()
                rate = await done
                while pending or wake.is_set() or len(ack_ms) < records:
                    await asyncio.sleep(0.01)
                return rate

            await paced(WARM_UP_RECORDS)
            ack_ms.clear()
            requests[0] = 0
            result_pipe.send("measuring")
            rate = await paced(count)
            sender.cancel()
            return ack_ms, requests[0], rate

    result_pipe.send(uvloop.run(produce()))


@dataclass
class FloorRun:
    ack_ms: list[float]
    e2e_ms: list[float]
    rounds: int
    achieved_rate_per_s: float
    cpu_s: dict[str, float]
    elapsed_s: float
    load: float

    def latency(self) -> dict:
        """Ack and e2e summaries and the achieved rate, as ``paced_latency`` gives them."""
        return {"ack": latency_summary(self.ack_ms), "e2e": latency_summary(self.e2e_ms),
                "achieved_rate_per_s": self.achieved_rate_per_s}


@contextlib.contextmanager
def floor_servers(ctx, record_bytes: int, *, storage: bool, kafka_rounds=None,
                  kafka_answer_delay_ms: float = 0.0
                  ) -> Iterator[tuple[dict[str, multiprocessing.process.BaseProcess], int, int]]:
    """The floor leader and its two followers, started: (the processes by name, the gRPC
    port, the Kafka port or 0). With ``storage`` each keeps its records in the broker's
    ``Log`` in a temporary folder; with ``kafka_rounds`` the leader also serves
    ``floor_kafka``'s listener. Stopped (by the processes' handles) and the folder removed
    on leaving, along with any process the caller added to the dict."""
    processes: dict[str, multiprocessing.process.BaseProcess] = {}
    storage_root = tempfile.mkdtemp(prefix="design-floor-storage-") if storage else None

    def storage_dir(name: str) -> str | None:
        return None if storage_root is None else os.path.join(storage_root, name)
    try:
        port_end, port_child = ctx.Pipe()
        processes["leader"] = ctx.Process(
            target=_leader_main, args=(port_child, record_bytes, storage_dir("leader"),
                                       kafka_rounds, kafka_answer_delay_ms), daemon=True)
        processes["leader"].start()
        if not port_end.poll(30):
            raise RuntimeError("the leader did not start")
        port, kafka_port = (port_end.recv(), 0) if kafka_rounds is None else port_end.recv()
        for follower_id in FOLLOWER_IDS:
            processes[f"follower {follower_id}"] = ctx.Process(
                target=_follower_main,
                args=(port, follower_id, record_bytes, storage_dir(f"follower-{follower_id}")),
                daemon=True)
            processes[f"follower {follower_id}"].start()
        yield processes, port, kafka_port
    finally:
        for process in reversed(processes.values()):  # the leader last: no follower sees it go
            process.kill()
            process.join(5)
        if storage_root is not None:
            shutil.rmtree(storage_root, ignore_errors=True)


def run_floor(rate_per_s: float, seconds: float, record_bytes: int, *,
              storage: bool = False) -> FloorRun:
    """The floor's five processes; with ``storage`` each replica keeps the records in the
    broker's ``Log`` and the clients send Kafka batches."""
    ctx = multiprocessing.get_context("spawn")
    with floor_servers(ctx, record_bytes, storage=storage) as (processes, port, _):
        servers = {name: int(p.pid or 0) for name, p in processes.items()}
        return _run_clients(ctx, f"127.0.0.1:{port}", rate_per_s, seconds, record_bytes, servers,
                            processes, kafka_batches=storage)


def run_floor_kafka(rate_per_s: float, seconds: float, record_bytes: int,
                    answer_delay_ms: float = 0.0) -> tuple[dict, int, dict[str, float], float]:
    """The floor with each replica's ``Log`` (``--storage``), its clients librdkafka over
    ``floor_kafka``'s listener on the leader: the bench's Kafka row
    (``kafka_side.paced_latency``) against the floor. Returns its figures, the Produce
    requests (rounds), the leader's and followers' CPU s, and the load.
    ``answer_delay_ms``: ``FloorKafkaServer``'s, to see how the clients take longer rounds."""
    from bench import kafka_side

    ctx = multiprocessing.get_context("spawn")
    produced = ctx.Value("q", 0, lock=False)
    with floor_servers(ctx, record_bytes, storage=True, kafka_rounds=produced,
                       kafka_answer_delay_ms=answer_delay_ms) as (processes, _, kafka_port):
        pids = {name: int(p.pid or 0) for name, p in processes.items()}
        before = {name: process_cpu_s(pid) for name, pid in pids.items()}
        rounds_before = produced.value
        got = kafka_side.paced_latency(f"127.0.0.1:{kafka_port}", "paced", record_bytes,
                                       int(rate_per_s * seconds), rate_per_s, groups=False)
        cpu = {name: process_cpu_s(pid) - before[name] for name, pid in pids.items()}
        return got, max(produced.value - rounds_before, 1), cpu, os.getloadavg()[0]


def run_cluster_kafka(rate_per_s: float, seconds: float, record_bytes: int) -> dict:
    """The bench's Kafka row (``kafka_side.paced_latency``) against the real 3-broker cluster."""
    from bench import kafka_side, tidewater_side

    with tidewater_side.paced_cluster("design-floor-kafka-cluster-") as (cluster, _directory):
        return kafka_side.paced_latency(cluster.local.manifest["kafka_bootstrap"], "paced",
                                        record_bytes, int(rate_per_s * seconds), rate_per_s)


def run_mixed(rate_per_s: float, seconds: float, record_bytes: int) -> FloorRun:
    """The floor's producer and receiver (no threads but the pacer, no library) against the
    real 3-broker cluster: Kafka batches built by ``encode_batch``, one per request, and
    read back with every batch's CRC checked. Its CPU names the leader "leader" and the
    other brokers "follower N"."""
    from bench import tidewater_side

    ctx = multiprocessing.get_context("spawn")
    clients: dict[str, multiprocessing.process.BaseProcess] = {}
    with tidewater_side.paced_cluster("design-floor-mixed-") as (cluster, _directory):
        try:
            leader = cluster.leader_of("paced")
            brokers = {proc["name"]: proc for proc in cluster.local.manifest["processes"].values()
                       if proc["name"].startswith("broker-")}
            servers = {("leader" if name == f"broker-{leader}" else f"follower {name.split('-')[1]}"):
                       int(proc["pid"]) for name, proc in brokers.items()}
            return _run_clients(ctx, brokers[f"broker-{leader}"]["listen"], rate_per_s, seconds,
                                record_bytes, servers, clients, kafka_batches=True)
        finally:
            for process in clients.values():
                process.kill()
                process.join(5)


def _run_clients(ctx, address: str, rate_per_s: float, seconds: float, record_bytes: int,
                 servers: dict[str, int], processes: dict[str, multiprocessing.process.BaseProcess],
                 *, kafka_batches: bool) -> FloorRun:
    """The floor's receiver and producer against the leader at ``address`` (added to
    ``processes``, which the caller stops); CPU of them and of ``servers`` (name -> pid)."""
    count = int(rate_per_s * seconds)
    receiver_end, receiver_child = ctx.Pipe()
    processes["receiver"] = ctx.Process(
        target=_receiver_main,
        args=(address, record_bytes, WARM_UP_RECORDS + count, receiver_child, kafka_batches),
        daemon=True)
    processes["receiver"].start()
    if not receiver_end.poll(30) or receiver_end.recv() != "ready":
        raise RuntimeError("the receiver did not start")
    producer_end, producer_child = ctx.Pipe()
    processes["producer"] = ctx.Process(
        target=_producer_main,
        args=(address, record_bytes, count, rate_per_s, producer_child, kafka_batches), daemon=True)
    processes["producer"].start()
    if not producer_end.poll(60) or producer_end.recv() != "measuring":
        raise RuntimeError("the producer's warm-up did not finish")
    pids = {**servers, "producer": int(processes["producer"].pid or 0),
            "receiver": int(processes["receiver"].pid or 0)}
    before = {name: process_cpu_s(pid) for name, pid in pids.items()}
    started = time.perf_counter()
    if not producer_end.poll(seconds + 60):
        raise RuntimeError("the producer did not finish")
    ack_ms, rounds, rate = producer_end.recv()
    elapsed = time.perf_counter() - started
    cpu = {name: process_cpu_s(pid) - before[name] for name, pid in pids.items()}
    load = os.getloadavg()[0]
    e2e_ms = receiver_latencies(receiver_end, 30)[-count:]
    return FloorRun(ack_ms, e2e_ms, rounds, rate, cpu, elapsed, load)


_E2E = re.compile(r"^(ack|e2e)\s+p50\s+(\S+) ms\s+p99\s+(\S+) ms")
_RUN = re.compile(r"^load average (\S+); run (\S+) s")
_CPU = re.compile(r"^  (broker-\d+|client \(producer \+ receiver\))\s+(\S+)$")
_ROUNDS = re.compile(r"^context switches per round \(([\d,]+) produce requests")


def run_cluster(rate_per_s: float, seconds: float, record_bytes: int) -> dict:
    """The real cluster's figures from ``latency_breakdown.py`` (a child process)."""
    out = subprocess.run(
        [sys.executable, str(PROJECT_DIR / "bench/probes/latency_breakdown.py"), "--rate", str(rate_per_s),
         "--seconds", str(seconds), "--record-bytes", str(record_bytes)],
        capture_output=True, text=True, check=True, timeout=seconds + 180).stdout
    return parse_breakdown(out)


def parse_breakdown(out: str) -> dict:
    """ack/e2e (p50, p99) ms, load, elapsed_s, rounds and each process's CPU s/s, from
    ``latency_breakdown.py``'s printout."""
    found: dict = {"cpu_s_per_s": {}}
    in_cpu_section = False  # the switches section below it has the same line shape
    for line in out.splitlines():
        if line.startswith("CPU seconds per second"):
            in_cpu_section = True
        elif not line.startswith("  "):
            in_cpu_section = False
        if m := _E2E.match(line):
            found[m.group(1)] = (float(m.group(2)), float(m.group(3)))
        elif m := _RUN.match(line):
            found["load"], found["elapsed_s"] = float(m.group(1)), float(m.group(2))
        elif in_cpu_section and (m := _CPU.match(line)):
            found["cpu_s_per_s"][m.group(1)] = float(m.group(2))
        elif m := _ROUNDS.match(line):
            found["rounds"] = int(m.group(1).replace(",", ""))
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rate", type=float, default=1000)
    parser.add_argument("--seconds", type=float, default=4)
    parser.add_argument("--record-bytes", type=int, default=1024)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--cluster", action="store_true",
                        help="alternate with latency_breakdown.py (the real cluster)")
    parser.add_argument("--mixed", action="store_true",
                        help="also the floor's producer and receiver against the real brokers")
    parser.add_argument("--storage", action="store_true",
                        help="also the floor with each replica's records in the broker's Log")
    parser.add_argument("--kafka", action="store_true",
                        help="also the floor + Log and the cluster with librdkafka clients "
                             "(the bench's Kafka row)")
    parser.add_argument("--kafka-answer-delay-ms", type=float, default=0.0,
                        help="with --kafka: the floor's Produce answers wait this much more")
    parser.add_argument("--peer", action="store_true",
                        help="alternate with JetStream's paced latency (a 3-node NATS cluster)")
    args = parser.parse_args(argv)
    processes = OwnedProcesses()
    peer_dir = tempfile.mkdtemp(prefix="design-floor-nats-") if args.peer else None
    try:
        peer = start_peer(peer_dir, processes) if peer_dir else None
        rows = run_rows(args, peer)
    finally:
        processes.stop_all()
        if peer_dir:
            shutil.rmtree(peer_dir, ignore_errors=True)
    print(f"{args.rate:,.0f} records/s of {args.record_bytes} B, acks=all, {args.seconds} s a run; "
          "CPU per round = CPU / produce requests; cluster: the leader is its busiest broker, "
          "records/round from its run time (it includes the receiver's start)")
    print(format_table(("run", "UTC", "load", "rate/s", "records/round", "e2e p50 ms", "e2e p99 ms",
                        "ack p50 ms", "ack p99 ms", "leader µs/round", "followers µs/round",
                        "producer + receiver µs/round"), rows,
                       align_right=(False, False, True, True, True, True, True, True, True, True, True, True)))
    return 0


def start_peer(directory: str, processes: OwnedProcesses) -> NatsCluster:
    """A started 3-node NATS cluster in ``directory`` (its servers in ``processes``)."""
    from bench.peer_nats import NatsCluster

    cluster = NatsCluster(directory, processes)
    cluster.start()
    return cluster


def run_peer(cluster: NatsCluster, name: str, rate_per_s: float, seconds: float,
             record_bytes: int) -> dict:
    from bench import peer_nats

    return asyncio.run(peer_nats.paced_latency(cluster, name, record_bytes,
                                               int(rate_per_s * seconds), rate_per_s))


def _latency_cells(got: dict) -> tuple[str, str, str, str]:
    """e2e p50, e2e p99, ack p50, ack p99 of a ``paced_latency``-shaped result ("-": no e2e)."""
    e2e, ack = got["e2e"], got["ack"]
    return (f"{e2e.p50_ms:.2f}" if e2e else "-", f"{e2e.p99_ms:.2f}" if e2e else "-",
            f"{ack.p50_ms:.2f}", f"{ack.p99_ms:.2f}")


def _floor_row(name: str, utc: str, run: FloorRun) -> tuple[str, ...]:
    cpu_us = {process: s / run.rounds * 1e6 for process, s in run.cpu_s.items()}
    return (name, utc, f"{run.load:.2f}", f"{run.achieved_rate_per_s:,.0f}",
            f"{len(run.ack_ms) / run.rounds:.2f}", *_latency_cells(run.latency()),
            f"{cpu_us['leader']:,.0f}",
            " / ".join(f"{us:,.0f}" for process, us in sorted(cpu_us.items())
                       if process.startswith("follower")),
            f"{cpu_us['producer']:,.0f} + {cpu_us['receiver']:,.0f}")


def run_rows(args: argparse.Namespace, peer: NatsCluster | None) -> list[tuple[str, ...]]:
    rows: list[tuple[str, ...]] = []
    for repeat in range(args.repeats):
        utc = time.strftime("%H:%M:%S", time.gmtime())
        floor = run_floor(args.rate, args.seconds, args.record_bytes)
        rows.append(_floor_row(f"floor #{repeat + 1}", utc, floor))
        if args.storage:
            utc = time.strftime("%H:%M:%S", time.gmtime())
            stored = run_floor(args.rate, args.seconds, args.record_bytes, storage=True)
            rows.append(_floor_row(f"floor + Log #{repeat + 1}", utc, stored))
        if args.kafka:
            utc = time.strftime("%H:%M:%S", time.gmtime())
            got, rounds, cpu, load = run_floor_kafka(args.rate, args.seconds, args.record_bytes,
                                                     args.kafka_answer_delay_ms)
            per_round = {name: f"{s / rounds * 1e6:,.0f}" for name, s in cpu.items()}
            delayed = (f", answers +{args.kafka_answer_delay_ms:g} ms"
                       if args.kafka_answer_delay_ms else "")
            rows.append((f"floor + Log, Kafka clients{delayed} #{repeat + 1}", utc, f"{load:.2f}",
                         f"{got['achieved_rate_per_s']:,.0f}",
                         f"{got['ack'].count / rounds:.2f}", *_latency_cells(got),
                         per_round["leader"],
                         " / ".join(per_round[f"follower {f}"] for f in FOLLOWER_IDS), ""))
            utc = time.strftime("%H:%M:%S", time.gmtime())
            load = os.getloadavg()[0]
            got = run_cluster_kafka(args.rate, args.seconds, args.record_bytes)
            rows.append((f"cluster, Kafka clients #{repeat + 1}", utc, f"{load:.2f}",
                         f"{got['achieved_rate_per_s']:,.0f}", "", *_latency_cells(got),
                         "", "", ""))
        if args.mixed:
            utc = time.strftime("%H:%M:%S", time.gmtime())
            mixed = run_mixed(args.rate, args.seconds, args.record_bytes)
            rows.append(_floor_row(f"brokers + floor clients #{repeat + 1}", utc, mixed))
        if args.cluster:
            utc = time.strftime("%H:%M:%S", time.gmtime())
            real = run_cluster(args.rate, args.seconds, args.record_bytes)
            per_round = real["elapsed_s"] / real["rounds"] * 1e6
            brokers = sorted(((s, n) for n, s in real["cpu_s_per_s"].items() if n.startswith("broker")),
                             reverse=True)
            client = real["cpu_s_per_s"].get("client (producer + receiver)", 0.0)
            rows.append((f"cluster #{repeat + 1}", utc, f"{real['load']:.2f}", "",
                         f"{args.rate * real['elapsed_s'] / real['rounds']:.2f}",
                         f"{real['e2e'][0]:.2f}", f"{real['e2e'][1]:.2f}",
                         f"{real['ack'][0]:.2f}", f"{real['ack'][1]:.2f}",
                         f"{brokers[0][0] * per_round:,.0f}",
                         " / ".join(f"{s * per_round:,.0f}" for s, _ in brokers[1:]),
                         f"{client * per_round:,.0f} (both)"))
        if peer is not None:
            utc = time.strftime("%H:%M:%S", time.gmtime())
            load = os.getloadavg()[0]
            got = run_peer(peer, f"FLOOR{repeat + 1}", args.rate, args.seconds, args.record_bytes)
            rows.append((f"jetstream #{repeat + 1}", utc, f"{load:.2f}",
                         f"{got['achieved_rate_per_s']:,.0f}", "", *_latency_cells(got),
                         "", "", ""))
    return rows


if __name__ == "__main__":
    sys.exit(main())
