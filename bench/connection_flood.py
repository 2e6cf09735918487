"""Does a flood of idle or slow connections leave a broker serving a producer?

    .venv/bin/python bench/connection_flood.py [--connections 1000] [--records 20000] [--secure]

Starts a local 1-broker cluster (`tide cluster up`, stopped by its recorded pids at the
end), then measures a confluent-kafka producer (acks=all, 1 KiB records, one topic)
on the Kafka listener in three phases:

- ``baseline``: nothing else connected;
- ``silent``: ``--connections`` connections open that never send a byte;
- ``trickle``: as many connections that each announced a 100 MiB frame and send one
  byte of it a second (a slow-loris client, and the 100 MiB frame that must not be
  allocated up front);
- ``grpc silent``: ``--connections`` raw TCP connections to the broker's client gRPC
  port that never send a byte (never the HTTP/2 preface);
- ``big frame`` (``--secure`` only): one unauthenticated Kafka connection that sends a
  100 MiB frame as fast as it can, and one unauthenticated gRPC Produce call carrying a
  100 MiB message, both repeated while the producer runs; the broker must refuse each
  before reading it (512 KiB before authentication on the Kafka listener,
  ``sasl.server.max.receive.size``; no message read without credentials on gRPC);
- ``baseline again``: nothing else connected, to show how much a shared machine
  moved the figures meanwhile.

``--secure``: the cluster runs SASL/SCRAM-SHA-512 on every port with the ACL authorizer
(`tide cluster up --sasl-mechanisms SCRAM-SHA-512`), the producer logs in as the
cluster's admin user, and every hostile connection is unauthenticated.

For each phase it prints the producer's records/s, the ratio to the baseline, the
hostile connections still open after the producer finished and again
``--hold-s`` seconds after they were opened (the gRPC port's handshake timeout is
10 s, ``broker/servicers/grpc_limits.py``), the broker's resident memory, and whether
the broker kept its session with the controller (same broker epoch, not fenced). The hostile connections use the broker's defaults
(connections.max.idle.ms 600000: they stay open for the whole run); see the README's
connection settings for the limits that close them.

``Flood`` is also what ``tests/cli/test_connection_flood.py`` uses, with a count that
fits the test budget.
"""

from __future__ import annotations

import argparse
import os
import socket
import struct
import sys
import tempfile
import threading
import time
from pathlib import Path

PROJECT_DIR = Path(__file__).resolve().parents[1]
if str(PROJECT_DIR) not in sys.path:
    sys.path.insert(0, str(PROJECT_DIR))

from bench.bench_common import KIB, format_table  # noqa: E402

TRICKLE_FRAME_BYTES = 100 * 1024 * 1024  # what a trickling connection's size prefix claims
TRICKLE_INTERVAL_S = 1.0


class Flood:
    """``count`` connections to ``host:port``: ``silent`` ones send nothing; ``trickle``
    ones announce a 100 MiB frame and send one byte of it every second (one thread for
    all of them). ``close()`` ends them all; ``closed_by_broker()`` counts those the
    broker has closed."""

    def __init__(self, host: str, port: int, count: int, *, trickle: bool,
                 source_host: str = "127.0.0.1"):
        self.sockets: list[socket.socket] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        try:
            for _ in range(count):
                s = socket.socket()
                s.bind((source_host, 0))
                s.connect((host, port))
                self.sockets.append(s)
        except BaseException:
            self.close()
            raise
        if trickle:
            for s in self.sockets:
                s.sendall(struct.pack(">i", TRICKLE_FRAME_BYTES))
            self._thread = threading.Thread(target=self._trickle, daemon=True,
                                            name="flood-trickle")
            self._thread.start()

    def _trickle(self) -> None:
        while not self._stop.wait(TRICKLE_INTERVAL_S):
            for s in self.sockets:
                try:
                    s.sendall(b"x")
                except OSError:
                    pass  # closed by the broker; counted by closed_by_broker

    def closed_by_broker(self) -> int:
        closed = 0
        for s in self.sockets:
            s.setblocking(False)
            try:
                # Read what the server sent first (a gRPC server's HTTP/2 SETTINGS) up to
                # the end of the stream, if it has come.
                while chunk := s.recv(65_536):
                    del chunk
                closed += 1
            except BlockingIOError:
                pass
            except OSError:
                closed += 1
        return closed

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        for s in self.sockets:
            s.close()


def produce_rate(bootstrap: str, topic: str, records: int, record_bytes: int = KIB,
                 client_config: dict[str, str] | None = None) -> float:
    """records/s of an acks=all confluent-kafka producer sending ``records`` records;
    ``client_config``: librdkafka's security settings."""
    import confluent_kafka

    producer = confluent_kafka.Producer({"bootstrap.servers": bootstrap, "acks": "all",
                                         "linger.ms": 5, "message.timeout.ms": 120_000,
                                         **(client_config or {})})
    errors: list[object] = []
    value = b"v" * record_bytes
    started = time.perf_counter()
    for _ in range(records):
        while True:
            try:
                producer.produce(topic, value=value,
                                 on_delivery=lambda err, _m: err and errors.append(err))
                break
            except BufferError:
                producer.poll(0.05)
    if producer.flush(180) != 0 or errors:
        raise RuntimeError(f"produce failed: {errors[:3]} ({len(errors)} errors)")
    return records / (time.perf_counter() - started)


def broker_session(controller: str, broker_id: int) -> tuple[int, bool]:
    """(broker epoch, fenced) of ``broker_id`` as a plaintext controller sees it."""
    import grpc

    from tidewater.proto import tidewater_pb2 as pb
    from tidewater.proto import tidewater_pb2_grpc as pb_grpc

    with grpc.insecure_channel(controller) as channel:
        answer = pb_grpc.ControllerStub(channel).DescribeCluster(pb.DescribeClusterRequest(),
                                                                 timeout=10)
    [broker] = [b for b in answer.brokers if b.broker_id == broker_id]
    return broker.broker_epoch, broker.fenced


def broker_session_of(admin, broker_id: int) -> tuple[int, bool]:
    """(broker epoch, fenced) of ``broker_id`` as the controller sees it, asked through
    ``admin`` (a client.admin.AdminClient, with the cluster's credentials)."""
    [broker] = [b for b in admin.describe_cluster().brokers if b.broker_id == broker_id]
    return broker.broker_epoch, broker.fenced


class BigFrames:
    """Unauthenticated 100 MiB requests, one after another until ``close()``, from a
    process of their own (so their copying does not take this process's GIL from the
    producer measured): a Kafka frame of that size sent as fast as the socket takes it,
    and a gRPC Produce whose message is that size. ``counts()``: for each, how many the
    broker ended before taking it all (``refused``) and how many it read to the end
    (``accepted``, must stay 0)."""

    def __init__(self, kafka: tuple[str, int], grpc_address: str) -> None:
        import multiprocessing

        context = multiprocessing.get_context("spawn")
        self._stop = context.Event()
        self._counts = context.Array("i", 4)  # kafka refused, accepted, grpc refused, accepted
        self._process = context.Process(target=_big_frames_main, daemon=True,
                                        args=(kafka, grpc_address, self._stop, self._counts))
        self._process.start()

    def counts(self) -> dict[str, dict[str, int]]:
        c = list(self._counts)
        return {"kafka": {"refused": c[0], "accepted": c[1]},
                "grpc": {"refused": c[2], "accepted": c[3]}}

    def close(self) -> None:
        self._stop.set()
        self._process.join(timeout=60)
        if self._process.is_alive():
            self._process.kill()


def _big_frames_main(kafka: tuple[str, int], grpc_address: str, stop, counts) -> None:
    def kafka_loop() -> None:
        chunk = b"\0" * (1024 * 1024)
        while not stop.is_set():
            try:
                with socket.create_connection(kafka, timeout=10) as s:
                    s.sendall(struct.pack(">i", TRICKLE_FRAME_BYTES))
                    for _ in range(TRICKLE_FRAME_BYTES // len(chunk)):
                        s.sendall(chunk)
                    counts[1] += 1
            except OSError:
                counts[0] += 1
            stop.wait(0.2)

    def grpc_loop() -> None:
        import grpc

        from tidewater.proto import tidewater_pb2 as pb
        from tidewater.proto import tidewater_pb2_grpc as pb_grpc

        request = pb.ProduceRequest(acks=1, partitions=[pb.ProducePartitionData(
            topic="flood", partition=0, records=b"\0" * TRICKLE_FRAME_BYTES)])
        options = [("grpc.max_send_message_length", 2 * TRICKLE_FRAME_BYTES)]
        while not stop.is_set():
            with grpc.insecure_channel(grpc_address, options=options) as channel:
                try:
                    pb_grpc.BrokerStub(channel).Produce(request, timeout=30)
                    counts[3] += 1
                except grpc.RpcError:
                    counts[2] += 1
            stop.wait(0.2)

    threads = [threading.Thread(target=kafka_loop, daemon=True),
               threading.Thread(target=grpc_loop, daemon=True)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def resident_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--connections", type=int, default=1000)
    parser.add_argument("--records", type=int, default=20_000)
    parser.add_argument("--hold-s", type=float, default=15.0)
    parser.add_argument("--secure", action="store_true",
                        help="SASL/SCRAM-SHA-512 and ACLs on every port; hostile "
                             "connections unauthenticated; adds the 100 MiB frame phase")
    args = parser.parse_args()

    from tidewater.client.admin import AdminClient
    from tidewater.tools import cluster_sasl
    from tidewater.tools.local_cluster import LocalCluster

    with tempfile.TemporaryDirectory(prefix="tw-flood-") as directory:
        cluster = LocalCluster(Path(directory))
        if args.secure:
            cluster.up(1, base_port=0, ready_timeout_s=120, sasl_mechanisms=("SCRAM-SHA-512",),
                       authorizer="acl")
        else:
            cluster.up(1, base_port=0, ready_timeout_s=120)
        try:
            manifest = cluster.manifest or {}
            broker = manifest["processes"]["broker-1"]
            host, port = broker["kafka"].rsplit(":", 1)
            grpc_host, grpc_port = broker["listen"].rsplit(":", 1)
            bootstrap = manifest["kafka_bootstrap"]
            sasl = manifest.get("sasl")
            client_config = {} if not sasl else {
                "security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": sasl["mechanism"],
                "sasl.username": sasl["username"],
                "sasl.password": cluster_sasl.read_password(sasl["command_config"])}
            security = cluster.security
            admin = AdminClient(manifest["bootstrap"], security_protocol=security.protocol,
                                sasl_mechanism=security.sasl_mechanism,
                                sasl_plain_username=security.sasl_username,
                                sasl_plain_password=security.sasl_password)
            produce_rate(bootstrap, "flood", 100, client_config=client_config)  # warms up
            epoch, _ = broker_session_of(admin, 1)
            rows = []
            baseline = None
            refusals = ""
            phases = ["baseline", "silent", "trickle", "grpc silent"]
            if args.secure:
                phases.append("big frame")
            # The baseline again at the end: how much the machine itself moved meanwhile.
            for phase in phases + ["baseline again"]:
                opened_at = time.monotonic()
                big: BigFrames | None = None
                if phase.startswith("baseline"):
                    flood = None
                elif phase == "big frame":
                    flood = None
                    big = BigFrames((host, int(port)), broker["listen"])
                elif phase.startswith("grpc"):
                    flood = Flood(grpc_host, int(grpc_port), args.connections, trickle=False)
                else:
                    flood = Flood(host, int(port), args.connections, trickle=phase == "trickle")
                try:
                    if flood is not None or big is not None:
                        time.sleep(3 * TRICKLE_INTERVAL_S)  # let the trickle start
                    rate = produce_rate(bootstrap, "flood", args.records,
                                        client_config=client_config)
                    baseline = baseline or rate
                    now_epoch, fenced = broker_session_of(admin, 1)
                    held = 0 if flood is None else len(flood.sockets) - flood.closed_by_broker()
                    if flood is not None:
                        time.sleep(max(0.0, opened_at + args.hold_s - time.monotonic()))
                    held_later = (0 if flood is None else
                                  len(flood.sockets) - flood.closed_by_broker())
                    rows.append((phase, str(held), str(held_later), f"{rate:,.0f}",
                                 f"{rate / baseline:.2f}",
                                 f"{resident_mib(broker['pid']):.0f}",
                                 "kept" if now_epoch == epoch and not fenced else
                                 f"LOST (epoch {epoch} -> {now_epoch}, fenced {fenced})"))
                finally:
                    if flood is not None:
                        flood.close()
                    if big is not None:
                        big.close()
                        n = big.counts()
                        refusals = (f"100 MiB requests without credentials: Kafka refused "
                                    f"{n['kafka']['refused']}, read {n['kafka']['accepted']}; "
                                    f"gRPC refused {n['grpc']['refused']}, read "
                                    f"{n['grpc']['accepted']}")
            admin.close()
            mode = "SASL/SCRAM + ACLs" if args.secure else "plaintext"
            print(f"connection flood, {mode} ({args.connections} connections, {args.records} records "
                  f"of 1 KiB acks=all, {time.strftime('%Y-%m-%d %H:%M', time.gmtime())} UTC, "
                  f"load average {os.getloadavg()[0]:.1f})")
            print(format_table(("phase", "hostile conns open", f"open at {args.hold_s:.0f} s",
                                "records/s", "vs baseline", "broker RSS MiB",
                                "controller session"), rows,
                               align_right=(False, True, True, True, True, True, False)))
            if refusals:
                print(refusals)
        finally:
            cluster.down(timeout_s=10)
    return 0


if __name__ == "__main__":
    sys.exit(main())
