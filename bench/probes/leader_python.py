"""The leader's own Python per record, without gRPC: CPU µs per record in one process.

    .venv/bin/python bench/probes/leader_python.py [--acks all|1] [--records 5000] [--consumer] [--idle-partitions N]
        [--sessionless]

One leader ``ReplicaManager`` (real on-disk log in a temporary directory, RF=3,
ISR of 3) behind ``BrokerServicer``'s stream handlers, driven through fake
stream contexts instead of gRPC: a ProduceStream sending one single-record
batch at a time and waiting for its answer, two followers on ReplicaFetch that
send their next fetch as soon as an answer arrives (long-polls of 500 ms) within a fetch
session as the broker's fetcher does (a full request, then incremental ones naming
partition 0 when it moved; ``--sessionless``: every request names every partition, as a
follower of an earlier release does), and
with ``--consumer`` one consumer on FetchStream doing the same. Prints the
process CPU microseconds per record (``time.process_time``), which is the
leader's Python (handlers, replica manager, purgatory, metrics, storage) plus a
small fixed cost of the fakes (a loop hop per write, building the followers'
requests and parsing their answers: ``ReplicaFetch`` answers with the wire bytes). gRPC's own per-message cost (bench/probes/cpu_per_record.py shows it in the
real cluster) is absent, so changes to the leader's Python show clearly here;
like any CPU figure it still moves a little with machine load, so compare
several runs.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time
from pathlib import Path

PROJECT_DIR = Path(__file__).resolve().parents[2]
if str(PROJECT_DIR) not in sys.path:
    sys.path.insert(0, str(PROJECT_DIR))

import grpc  # noqa: E402
import uvloop  # noqa: E402

from tidewater.broker.config import BrokerConfig  # noqa: E402
from tidewater.broker.metrics import BrokerMetrics  # noqa: E402
from tidewater.broker.replicas.metadata_cache import MetadataCache  # noqa: E402
from tidewater.broker.replicas.replica_manager import ReplicaManager  # noqa: E402
from tidewater.broker.servicers.grpc_server import (  # noqa: E402
    BrokerControlServicer,
    BrokerServicer,
)
from tidewater.broker.storage.log_config import LogConfig  # noqa: E402
from tidewater.broker.storage.log_manager import LogManager  # noqa: E402
from tidewater.proto import tidewater_pb2 as pb  # noqa: E402
from tidewater.proto.records import encode_batch  # noqa: E402
from tidewater.proto.supervisor import TaskSupervisor  # noqa: E402

TOPIC = "t"
TOPIC_ID = bytes(range(1, 17))  # LeaderAndIsr names the incarnation
WARM_UP_RECORDS = 300


def _die(error: BaseException) -> None:
    """A background task died (the supervisor logged it): the probe's numbers mean nothing."""
    print(f"probe stopped: a background task died: {error!r}", file=sys.stderr, flush=True)
    os._exit(70)


def _watched(task: asyncio.Task) -> asyncio.Task:
    """A handler that dies would leave the probe waiting for ever: stop instead."""
    task.add_done_callback(
        lambda t: t.cancelled() or t.exception() is None or _die(t.exception()))
    return task


class FakeStreamContext:
    """The read/write half of a grpc.aio servicer context; a write costs one loop hop."""

    def __init__(self, on_write) -> None:
        self.inbox: asyncio.Queue = asyncio.Queue()
        self._on_write = on_write

    async def read(self):
        return await self.inbox.get()

    async def write(self, message) -> None:
        await asyncio.sleep(0)
        self._on_write(message)

    def invocation_metadata(self):  # the handlers read the caller's client-id from it
        return ()


def fetch_request(replica_id: int, offset: int, idle_partitions: int = 0,
                  session_mode: int = pb.SESSIONLESS) -> pb.FetchRequest:
    """A fetch of partition 0 at ``offset``; a follower's names the idle partitions too
    (at offset 0), as a real follower's names every partition it follows from a leader,
    except in an incremental request (``session_mode``), which names only partition 0,
    and only if ``offset`` is not None."""
    follower = replica_id >= 0
    request = pb.FetchRequest(
        replica_id=replica_id, replica_broker_epoch=-1, max_wait_ms=500, min_bytes=1,
        max_bytes=1 << 20, session_mode=session_mode)
    if offset is not None:
        request.partitions.add(
            topic=TOPIC, partition=0, current_leader_epoch=0 if follower else -1,
            fetch_offset=offset, last_fetched_epoch=0 if follower and offset else -1,
            partition_max_bytes=1 << 20)
    if follower and session_mode != pb.SESSION_INCREMENTAL:
        for index in range(1, idle_partitions + 1):
            request.partitions.add(topic=TOPIC, partition=index, current_leader_epoch=0,
                                   fetch_offset=0, last_fetched_epoch=-1,
                                   partition_max_bytes=1 << 20)
    return request


def leader_of(index: int) -> pb.LeaderAndIsrPartition:
    return pb.LeaderAndIsrPartition(
        state=pb.PartitionState(topic=TOPIC, partition=index, leader=1, leader_epoch=0,
                                partition_epoch=0, replicas=[1, 2, 3], isr=[1, 2, 3],
                                topic_id=TOPIC_ID),
        topic_configs={"min.insync.replicas": "2"}, is_new=True)


async def run(directory: Path, acks: int, records: int, consumer: bool,
              idle_partitions: int = 0, sessions: bool = True) -> float:
    config = BrokerConfig(broker_id=1, listen=("127.0.0.1", 0), controller=("127.0.0.1", 1),
                          data_dir=directory)
    log_manager = LogManager(directory, LogConfig())
    log_manager.load(int(time.time() * 1000))

    async def alter_partition(items):
        return pb.AlterPartitionResponse(error_code=pb.NONE)

    rm = ReplicaManager(config=config, log_manager=log_manager, metadata_cache=MetadataCache(),
                        metrics=BrokerMetrics(1), alter_partition=alter_partition,
                        broker_epoch=lambda: 1, supervisor=TaskSupervisor(on_fatal=_die))
    rm.load()
    await rm.leader_and_isr(pb.LeaderAndIsrRequest(
        controller_id=0, controller_epoch=1, broker_epoch=1,
        partitions=[leader_of(index) for index in range(idle_partitions + 1)]))
    servicer = BrokerServicer(rm, rm.metadata_cache, rm.metrics, "INTERNAL")
    control = BrokerControlServicer(rm, rm.metrics)  # ReplicaFetch: the INTERNAL listener's
    offsets = {2: 0, 3: 0, -1: 0}
    contexts: dict[int, FakeStreamContext] = {}

    first_mode = pb.SESSION_FULL if sessions else pb.SESSIONLESS

    def fetcher(reader_id: int):
        def on_answer(response: pb.FetchResponse | bytes) -> None:
            if isinstance(response, bytes):  # ReplicaFetch answers with the wire bytes
                response = pb.FetchResponse.FromString(response)
            before = offsets[reader_id]
            for p in response.partitions:  # a session's answer may leave partition 0 out
                if p.partition == 0 and p.records:
                    # A follower continues at the LEO, a consumer at the HW.
                    offsets[reader_id] = (p.log_end_offset if reader_id >= 0
                                          else p.high_watermark)
            if reader_id >= 0 and response.session_held:
                moved = offsets[reader_id] if offsets[reader_id] != before else None
                request = fetch_request(reader_id, moved, idle_partitions,
                                        pb.SESSION_INCREMENTAL)
            else:
                request = fetch_request(reader_id, offsets[reader_id], idle_partitions,
                                        first_mode if reader_id >= 0 else pb.SESSIONLESS)
            contexts[reader_id].inbox.put_nowait(request)
        return on_answer

    tasks = []
    for reader_id in (2, 3, -1) if consumer else (2, 3):
        contexts[reader_id] = FakeStreamContext(fetcher(reader_id))
        contexts[reader_id].inbox.put_nowait(fetch_request(
            reader_id, 0, idle_partitions, first_mode if reader_id >= 0 else pb.SESSIONLESS))
        handler = control.ReplicaFetch if reader_id >= 0 else servicer.FetchStream
        tasks.append(_watched(asyncio.create_task(handler(None, contexts[reader_id]))))
    answered = asyncio.Event()
    producer = FakeStreamContext(lambda response: answered.set())
    tasks.append(_watched(asyncio.create_task(servicer.ProduceStream(None, producer))))
    batch = encode_batch([(None, bytes(1024))])

    async def produce_one(i: int) -> None:
        answered.clear()
        producer.inbox.put_nowait(pb.ProduceRequest(
            acks=acks, timeout_ms=30_000, correlation_id=i,
            partitions=[pb.ProducePartitionData(topic=TOPIC, partition=0, records=batch)]))
        await answered.wait()
        while offsets[2] <= i or offsets[3] <= i:  # acks=1: the followers have it too
            await asyncio.sleep(0)

    for i in range(WARM_UP_RECORDS):
        await produce_one(i)
    started = time.process_time()
    for i in range(WARM_UP_RECORDS, WARM_UP_RECORDS + records):
        await produce_one(i)
    cpu_s = time.process_time() - started
    for context in [producer, *contexts.values()]:
        context.inbox.put_nowait(grpc.aio.EOF)
    await asyncio.gather(*tasks, return_exceptions=True)
    await rm.stop()
    log_manager.shutdown()
    return cpu_s / records * 1e6


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--acks", choices=["all", "1"], default="all")
    parser.add_argument("--records", type=int, default=5000)
    parser.add_argument("--consumer", action="store_true", help="one consumer on FetchStream")
    parser.add_argument("--idle-partitions", type=int, default=0,
                        help="more partitions led here, idle, named in every follower fetch "
                             "(a 3-broker cluster's leader leads ~17 of __consumer_offsets' 50)")
    parser.add_argument("--sessionless", action="store_true",
                        help="followers name every partition in every request, as a follower "
                             "of an earlier release")
    args = parser.parse_args(argv)
    acks = -1 if args.acks == "all" else 1
    with tempfile.TemporaryDirectory() as directory:
        us = uvloop.run(run(Path(directory), acks, args.records, args.consumer,
                            args.idle_partitions, sessions=not args.sessionless))
    idle = f" +{args.idle_partitions} idle partitions" if args.idle_partitions else ""
    idle += " (sessionless followers)" if args.sessionless else ""
    print(f"acks={args.acks}{' +consumer' if args.consumer else ''}{idle}: "
          f"{us:,.0f} CPU µs per record (leader Python, no gRPC)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
