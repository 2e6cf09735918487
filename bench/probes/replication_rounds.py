"""The broker's own cost of one acks=all write, without processes or a client in the way.

    .venv/bin/python bench/probes/replication_rounds.py [--records 500] [--record-bytes 1024]

One leader ``ReplicaManager`` behind a real gRPC server and two follower
``ReplicaManager``s fetching from it over gRPC, all in this process on one
uvloop loop, each with real on-disk logs in a temporary directory (ISR of 3,
min.insync.replicas 2). Produces ``--records`` single-record batches with
acks=all one at a time and prints: follower fetch requests the leader answered
per record (the replication round trips), CPU microseconds per record for all
three replicas together (``time.process_time``: robust to other load on the
machine, unlike wall time) and the produce->ack percentiles (wall time: only
meaningful on an idle machine).
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import tempfile
import time
from pathlib import Path

PROJECT_DIR = Path(__file__).resolve().parents[2]
if str(PROJECT_DIR) not in sys.path:
    sys.path.insert(0, str(PROJECT_DIR))

import uvloop  # noqa: E402

from tidewater.broker.config import BrokerConfig  # noqa: E402
from tidewater.broker.metrics import BrokerMetrics  # noqa: E402
from tidewater.broker.replicas.metadata_cache import MetadataCache  # noqa: E402
from tidewater.broker.replicas.replica_manager import ReplicaManager  # noqa: E402
from tidewater.broker.servicers.admin_forwarding import ControllerForwarder  # noqa: E402
from tidewater.broker.servicers.grpc_server import (  # noqa: E402
    BrokerControlServicer,
    BrokerServicer,
    build_server,
)
from tidewater.broker.storage.log_config import LogConfig  # noqa: E402
from tidewater.broker.storage.log_manager import LogManager  # noqa: E402
from tidewater.proto import tidewater_pb2 as pb  # noqa: E402
from tidewater.proto.records import encode_batch  # noqa: E402
from tidewater.proto.supervisor import TaskSupervisor  # noqa: E402

TOPIC = "rounds"
TOPIC_ID = bytes(range(1, 17))  # LeaderAndIsr names the incarnation
REPLICAS = (1, 2, 3)


def _die(error: BaseException) -> None:
    """A background task died (the supervisor logged it): the probe's numbers mean nothing."""
    print(f"probe stopped: a background task died: {error!r}", file=sys.stderr, flush=True)
    os._exit(70)


def replica_manager(broker_id: int, data_dir: Path) -> ReplicaManager:
    config = BrokerConfig(broker_id=broker_id, listen=("127.0.0.1", 0),
                          controller=("127.0.0.1", 1), data_dir=data_dir)
    log_manager = LogManager(data_dir, LogConfig())
    log_manager.load(int(time.time() * 1000))

    async def alter_partition(items):
        return pb.AlterPartitionResponse(error_code=pb.NONE)

    rm = ReplicaManager(config=config, log_manager=log_manager, metadata_cache=MetadataCache(),
                        metrics=BrokerMetrics(broker_id), alter_partition=alter_partition,
                        broker_epoch=lambda: 1, supervisor=TaskSupervisor(on_fatal=_die))
    rm.load()
    return rm


def leader_and_isr(leader_port: int) -> pb.LeaderAndIsrRequest:
    return pb.LeaderAndIsrRequest(
        controller_id=0, controller_epoch=1, broker_epoch=1,
        partitions=[pb.LeaderAndIsrPartition(
            state=pb.PartitionState(topic=TOPIC, partition=0, leader=1, leader_epoch=0,
                                    partition_epoch=0, replicas=list(REPLICAS), isr=list(REPLICAS),
                                    topic_id=TOPIC_ID),
            topic_configs={"min.insync.replicas": "2"}, is_new=True)],
        leaders=[pb.BrokerEndpoint(broker_id=1, host="127.0.0.1", port=leader_port)])


def percentile(sorted_ms: list[float], q: float) -> float:
    return sorted_ms[min(len(sorted_ms) - 1, int(len(sorted_ms) * q))]


async def run(records: int, record_bytes: int, directory: Path) -> None:
    leader = replica_manager(1, directory / "1")
    followers = [replica_manager(b, directory / str(b)) for b in REPLICAS[1:]]
    answered = {"fetch": 0}
    fetch = leader.fetch_partitions

    async def counted_fetch(request, session=None):
        answered["fetch"] += 1
        return await fetch(request, session)

    leader.fetch_partitions = counted_fetch  # what ReplicaFetch calls
    servicer = BrokerServicer(leader, leader.metadata_cache, leader.metrics, "INTERNAL")
    server, port = build_server(host="127.0.0.1", port=0, servicer=servicer,
                                controller_servicer=ControllerForwarder(None),
                                max_message_bytes=64 << 20,
                                control_servicer=BrokerControlServicer(leader, leader.metrics))
    await server.start()
    try:
        for rm in (leader, *followers):
            response = await rm.leader_and_isr(leader_and_isr(port))
            assert response.partitions[0].error_code == pb.NONE, response
        request = pb.ProduceRequest(acks=-1, timeout_ms=10_000, partitions=[pb.ProducePartitionData(
            topic=TOPIC, partition=0, records=encode_batch([(None, os.urandom(record_bytes))]))])

        async def produce_one() -> None:
            answer = await leader.produce(request)
            assert answer.partitions[0].error_code == pb.NONE, answer

        for _ in range(50):  # warm-up: streams open, followers caught up
            await produce_one()
        answered["fetch"] = 0
        latencies_ms = []
        cpu_started = time.process_time()
        for _ in range(records):
            started = time.perf_counter()
            await produce_one()
            latencies_ms.append((time.perf_counter() - started) * 1000)
        cpu_s = time.process_time() - cpu_started
    finally:
        for rm in (*followers, leader):
            await rm.stop()
            rm.log_manager.shutdown()
        await server.stop(0)
    latencies_ms.sort()
    print(f"records {records} x {record_bytes} B acks=all; load average {os.getloadavg()[0]:.2f}")
    print(f"follower fetches answered per record  {answered['fetch'] / records:.2f}")
    print(f"CPU per record (3 replicas)           {cpu_s / records * 1e6:.0f} us")
    print(f"produce->ack p50 / p99 / max          {percentile(latencies_ms, 0.5):.2f} / "
          f"{percentile(latencies_ms, 0.99):.2f} / {latencies_ms[-1]:.2f} ms")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=500)
    parser.add_argument("--record-bytes", type=int, default=1024)
    args = parser.parse_args(argv)
    logging.disable(logging.WARNING)  # only the rounds table on the terminal
    with tempfile.TemporaryDirectory(prefix="tw-rounds-") as directory:
        uvloop.run(run(args.records, args.record_bytes, Path(directory)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
