"""The peer: a 3-node NATS JetStream cluster on 127.0.0.1, driven through nats-py.

Layout of the peer's directory ``DIR`` (a temporary directory)::

    DIR/n<i>.conf     server config: server_name, listen, jetstream { store_dir },
                      cluster { name, listen, routes } (all on 127.0.0.1)
    DIR/n<i>/         JetStream file store of server i
    DIR/n<i>.log      server output

Every server is started by this module (``OwnedProcesses``) and stopped by
pid. Streams use file storage with 3 replicas; a JetStream publish ack comes
after the stream's Raft quorum stored the message (there is no weaker ack
level), which is the counterpart of Tidewater's acks=all. Each workload
connects to the *stream leader* only, as the issue asks.

Workloads (each on its own fresh stream):
- ``throughput``: ``publish_async`` with ``max_in_flight`` (256) pending acks.
- ``ack_latency_serial``: ``publish`` one at a time, each waiting for its ack.
- ``paced_latency``: ``publish_async`` at a fixed rate; per message the
  publish-to-ack time and, in a receiver process (push consumer, deliver
  new), the publish-to-receipt time (see bench/probes/latency_probe.py).
- ``consume``: a pull consumer (no acks) reading a stream from the start.
- ``failover``: one-at-a-time publishes while the stream leader gets SIGKILL;
  time to the first acknowledged publish sent after the kill.
- ``restart``: one server after SIGKILL and after SIGTERM: launch to accepting
  clients, and to every stream's replicas current again.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from bench.bench_common import (
    HOST,
    LatencySummary,
    OwnedProcesses,
    Throughput,
    free_port,
    latency_summary,
    median,
    receiver_latencies,
    stop_child,
)
from bench.probes.latency_probe import read_stamp, run_paced_async, stamped_payload

NODES = 3
READY_TIMEOUT_S = 30.0
CONSUME_TIMEOUT_S = 300.0


async def _quiet(_error: Exception) -> None:
    """nats-py prints every connection error with a traceback by default; the callers here
    report their own failures."""


class PeerUnavailable(Exception):
    """The peer cannot run here (no nats-server, no nats-py, or the cluster did not form)."""


def nats_server_path() -> str | None:
    return shutil.which("nats-server") or (
        "/usr/sbin/nats-server" if os.access("/usr/sbin/nats-server", os.X_OK) else None)


def server_config(name: str, client_port: int, cluster_port: int, route_ports: list[int],
                  store_dir: Path) -> str:
    routes = ", ".join(f'"nats-route://{HOST}:{p}"' for p in route_ports)
    return (f'server_name: "{name}"\n'
            f'listen: "{HOST}:{client_port}"\n'
            f"max_payload: 8MB\n"
            f"jetstream {{\n  store_dir: \"{store_dir}\"\n}}\n"
            f"cluster {{\n  name: \"bench\"\n  listen: \"{HOST}:{cluster_port}\"\n"
            f"  routes: [{routes}]\n}}\n")


@dataclass
class NatsNode:
    name: str
    client_port: int
    cluster_port: int

    @property
    def url(self) -> str:
        return f"nats://{HOST}:{self.client_port}"


class NatsCluster:
    def __init__(self, directory: str | Path, processes: OwnedProcesses):
        self.directory = Path(directory)
        self.processes = processes
        self.nodes: list[NatsNode] = []
        self.children: dict[str, subprocess.Popen] = {}
        self.version = ""

    def start(self) -> None:
        binary = nats_server_path()
        if binary is None:
            raise PeerUnavailable("nats-server not installed (apt-get install -y nats-server)")
        try:
            import nats  # noqa: F401
        except ImportError:
            raise PeerUnavailable("nats-py not installed (pip install nats-py)") from None
        self.version = subprocess.run([binary, "--version"], capture_output=True, text=True,
                                      timeout=10).stdout.strip()
        self.directory.mkdir(parents=True, exist_ok=True)
        self.nodes = [NatsNode(f"n{i}", free_port(), free_port()) for i in range(1, NODES + 1)]
        for node in self.nodes:
            store = self.directory / node.name
            store.mkdir(exist_ok=True)
            conf = self.directory / f"{node.name}.conf"
            conf.write_text(server_config(node.name, node.client_port, node.cluster_port,
                                          [n.cluster_port for n in self.nodes if n is not node], store))
            self._launch(node)
        try:
            asyncio.run(self._wait_ready())
        except Exception as e:  # any failure here means "peer unavailable"
            raise PeerUnavailable(f"JetStream cluster did not form: {e!r}; logs in {self.directory}") from None

    def _launch(self, node: NatsNode) -> None:
        argv = [nats_server_path(), "-c", str(self.directory / f"{node.name}.conf")]
        self.children[node.name] = self.processes.start(
            argv, log_path=str(self.directory / f"{node.name}.log"))

    def node(self, name: str) -> NatsNode:
        return next(n for n in self.nodes if n.name == name)

    def kill(self, name: str, sig: int = signal.SIGKILL, timeout_s: float = 60) -> float:
        """Signal one server (by its pid) and wait until it exited; returns the seconds waited."""
        child = self.children[name]
        start = time.monotonic()
        child.send_signal(sig)
        child.wait(timeout=timeout_s)
        return time.monotonic() - start

    def restart(self, name: str) -> None:
        if self.children[name].poll() is None:
            raise RuntimeError(f"{name} is still running")
        self._launch(self.node(name))

    def store_bytes(self, name: str) -> int:
        total = 0
        for root, _dirs, files in os.walk(self.directory / name):
            for file_name in files:
                try:
                    total += os.path.getsize(os.path.join(root, file_name))
                except OSError:
                    pass
        return total

    async def wait_client_port(self, name: str, timeout_s: float = READY_TIMEOUT_S) -> float:
        """Seconds until server ``name`` greets a new client (the NATS ``INFO`` line a server
        sends on every accepted connection). A raw socket: nats-py's own connect waits 2 s
        between tries of one server."""
        node = self.node(name)
        start = time.monotonic()
        while time.monotonic() - start < timeout_s:
            try:
                reader, writer = await asyncio.wait_for(
                    asyncio.open_connection(HOST, node.client_port), timeout=1)
                try:
                    line = await asyncio.wait_for(reader.readline(), timeout=1)
                finally:
                    writer.close()
                if line.startswith(b"INFO "):
                    return time.monotonic() - start
            except (OSError, TimeoutError):
                pass
            await asyncio.sleep(0.01)
        raise TimeoutError(f"{name} not accepting connections after {timeout_s} s")

    async def wait_streams_current(self, streams: list[str], timeout_s: float = 120) -> float:
        """Seconds until every stream has a leader and all replicas current."""
        import nats

        start = time.monotonic()
        nc = await nats.connect([n.url for n in self.nodes], connect_timeout=2, error_cb=_quiet)
        try:
            js = nc.jetstream(timeout=2)
            pending = list(streams)
            while pending and time.monotonic() - start < timeout_s:
                try:
                    info = await js.stream_info(pending[0])
                    cluster = info.cluster
                    replicas = (cluster.replicas or []) if cluster else []
                    if (cluster and cluster.leader and len(replicas) == NODES - 1
                            and all(r.current and not r.offline for r in replicas)):
                        pending.pop(0)
                        continue
                except Exception:  # meta leader moving: ask again
                    pass
                await asyncio.sleep(0.05)
            if pending:
                raise TimeoutError(f"streams {pending} not current after {timeout_s} s")
            return time.monotonic() - start
        finally:
            await nc.close()

    async def stream_leader(self, name: str) -> str:
        import nats

        nc = await nats.connect([n.url for n in self.nodes], connect_timeout=2, error_cb=_quiet)
        try:
            return (await nc.jetstream(timeout=5).stream_info(name)).cluster.leader
        finally:
            await nc.close()

    async def _wait_ready(self) -> None:
        """Ready when a replicated stream can be created (meta leader elected, peers known)."""
        import nats

        deadline = time.monotonic() + READY_TIMEOUT_S
        last_error: Exception | None = None
        while time.monotonic() < deadline:
            try:
                nc = await nats.connect(self.nodes[0].url, connect_timeout=2, allow_reconnect=False,
                                         error_cb=_quiet)
                try:
                    js = nc.jetstream(timeout=5)
                    await self._create_stream(js, "READY_CHECK")
                    await js.delete_stream("READY_CHECK")
                    return
                finally:
                    await nc.close()
            except Exception as e:  # retried until the deadline
                last_error = e
                await asyncio.sleep(0.5)
        raise TimeoutError(f"not ready after {READY_TIMEOUT_S} s: {last_error!r}")

    @staticmethod
    async def _create_stream(js, name: str) -> None:
        from nats.js.api import StorageType, StreamConfig

        await js.add_stream(StreamConfig(name=name, subjects=[f"{name.lower()}.>"],
                                         storage=StorageType.FILE, num_replicas=NODES,
                                         max_msg_size=-1))

    async def stream_leader_url(self, name: str, *, create: bool = True) -> str:
        """Create stream ``name`` (R3, file) unless ``create`` is False, wait until it has a
        leader and both replicas are current, and return the leader's client URL."""
        import nats

        nc = await nats.connect([n.url for n in self.nodes], connect_timeout=2, error_cb=_quiet)
        try:
            js = nc.jetstream(timeout=10)
            if create:
                await self._create_stream(js, name)
            deadline = time.monotonic() + READY_TIMEOUT_S
            while time.monotonic() < deadline:
                info = await js.stream_info(name)
                cluster = info.cluster
                replicas = (cluster.replicas or []) if cluster else []
                if (cluster and cluster.leader and len(replicas) == NODES - 1
                        and all(r.current for r in replicas)):
                    return next(n.url for n in self.nodes if n.name == cluster.leader)
                await asyncio.sleep(0.1)
            raise TimeoutError(f"stream {name} has no leader with current replicas")
        finally:
            await nc.close()

    async def delete_stream(self, name: str) -> None:
        import nats

        nc = await nats.connect([n.url for n in self.nodes], connect_timeout=2, error_cb=_quiet)
        try:
            await nc.jetstream(timeout=10).delete_stream(name)
        finally:
            await nc.close()


# ---------------------------------------------------------------------- workloads


async def _connect_leader(url: str):
    import nats

    # Only the leader: the client must not wander to a follower through discovered servers.
    return await nats.connect(url, connect_timeout=2, dont_randomize=True,
                              max_reconnect_attempts=0, pending_size=64 * 1024 * 1024,
                              error_cb=_quiet)


async def throughput(cluster: NatsCluster, stream: str, record_bytes: int, duration_s: float,
                     max_in_flight: int = 256) -> Throughput:
    """``publish_async`` for ``duration_s`` with ``max_in_flight`` acks pending; the clock
    stops when the last ack arrived."""
    url = await cluster.stream_leader_url(stream)
    nc = await _connect_leader(url)
    try:
        js = nc.jetstream(timeout=30, publish_async_max_pending=max_in_flight)
        subject = f"{stream.lower()}.data"
        payload = os.urandom(record_bytes)
        failures = [0]

        def check(fut) -> None:
            if fut.cancelled() or fut.exception() is not None:
                failures[0] += 1

        count = 0
        start = time.perf_counter()
        while time.perf_counter() - start < duration_s:
            for _ in range(200):
                (await js.publish_async(subject, payload)).add_done_callback(check)
            count += 200
        await asyncio.wait_for(js.publish_async_completed(), timeout=120)
        elapsed = time.perf_counter() - start
        if failures[0]:
            raise RuntimeError(f"{failures[0]} of {count} JetStream publishes failed")
        return Throughput(count, count * record_bytes, elapsed)
    finally:
        await nc.close()


async def ack_latency_serial(cluster: NatsCluster, stream: str, record_bytes: int,
                             count: int) -> LatencySummary:
    url = await cluster.stream_leader_url(stream)
    nc = await _connect_leader(url)
    try:
        js = nc.jetstream(timeout=10)
        subject = f"{stream.lower()}.data"
        payload = os.urandom(record_bytes)
        samples = []
        for _ in range(count):
            t0 = time.perf_counter()
            await js.publish(subject, payload)
            samples.append((time.perf_counter() - t0) * 1000)
        return latency_summary(samples)
    finally:
        await nc.close()


def _receiver_main(url: str, stream: str, expected: int, timeout_s: float, conn) -> None:
    """Receiver process: push consumer from new messages; sends back latencies (ms)."""
    asyncio.run(_receiver(url, stream, expected, timeout_s, conn))


async def _receiver(url: str, stream: str, expected: int, timeout_s: float, conn) -> None:
    import nats
    from nats.js.api import DeliverPolicy

    latencies: list[float] = []
    done = asyncio.Event()
    nc = await nats.connect(url, connect_timeout=2, dont_randomize=True, error_cb=_quiet)
    try:
        js = nc.jetstream(timeout=10)

        async def on_message(msg) -> None:
            latencies.append((time.time_ns() - read_stamp(msg.data)) / 1e6)
            if len(latencies) >= expected:
                done.set()

        sub = await js.subscribe(f"{stream.lower()}.>", cb=on_message, ordered_consumer=True,
                                 deliver_policy=DeliverPolicy.NEW)
        conn.send("ready")
        try:
            await asyncio.wait_for(done.wait(), timeout=timeout_s)
        except TimeoutError:
            pass
        await sub.unsubscribe()
    finally:
        await nc.close()
    conn.send(latencies)
    conn.close()


async def paced_latency(cluster: NatsCluster, stream: str, record_bytes: int, count: int,
                        rate_per_s: float) -> dict:
    """Publish ``count`` stamped messages at ``rate_per_s``; returns ack and end-to-end
    LatencySummary plus the achieved rate."""
    url = await cluster.stream_leader_url(stream)
    ctx = multiprocessing.get_context("spawn")
    parent_end, child_end = ctx.Pipe()
    timeout_s = count / rate_per_s + 30
    receiver = ctx.Process(target=_receiver_main, args=(url, stream, count, timeout_s, child_end),
                           daemon=True)
    receiver.start()
    try:
        if not parent_end.poll(30) or parent_end.recv() != "ready":
            raise RuntimeError("NATS latency receiver did not start")
        nc = await _connect_leader(url)
        try:
            js = nc.jetstream(timeout=30, publish_async_max_pending=4096)
            subject = f"{stream.lower()}.data"
            filler = os.urandom(record_bytes)
            ack_ms: list[float] = []

            async def send_one(_index: int, due_ns: int) -> None:
                fut = await js.publish_async(subject, stamped_payload(record_bytes, due_ns, filler))
                fut.add_done_callback(
                    lambda f, due_ns=due_ns: ack_ms.append((time.time_ns() - due_ns) / 1e6)
                    if f.exception() is None else None)

            achieved = await run_paced_async(count, rate_per_s, send_one)
            await asyncio.wait_for(js.publish_async_completed(), timeout=60)
        finally:
            await nc.close()
        e2e_ms = receiver_latencies(parent_end, timeout_s)
    finally:
        stop_child(receiver)
    if len(ack_ms) != count:
        raise RuntimeError(f"only {len(ack_ms)} of {count} paced publishes were acknowledged")
    return {"ack": latency_summary(ack_ms), "e2e": latency_summary(e2e_ms) if e2e_ms else None,
            "received": len(e2e_ms), "achieved_rate_per_s": achieved}


async def consume(cluster: NatsCluster, stream: str, expected: int, record_bytes: int,
                  batch: int = 2000) -> Throughput:
    """Read ``expected`` messages of ``stream`` from the beginning with a pull consumer."""
    import nats.errors
    from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

    url = await cluster.stream_leader_url(stream, create=False)
    nc = await _connect_leader(url)
    try:
        js = nc.jetstream(timeout=30)
        sub = await js.pull_subscribe(f"{stream.lower()}.>", stream=stream, config=ConsumerConfig(
            ack_policy=AckPolicy.NONE, deliver_policy=DeliverPolicy.ALL, max_waiting=16))
        received = 0
        payload_bytes = 0
        start = time.perf_counter()
        deadline = time.monotonic() + CONSUME_TIMEOUT_S
        while received < expected:
            if time.monotonic() > deadline:
                raise TimeoutError(f"read {received} of {expected} messages in {CONSUME_TIMEOUT_S} s")
            try:
                msgs = await sub.fetch(batch=min(batch, expected - received), timeout=5)
            except nats.errors.TimeoutError:
                continue
            received += len(msgs)
            payload_bytes += sum(len(m.data) for m in msgs)
        elapsed = time.perf_counter() - start
        await sub.unsubscribe()
        return Throughput(received, payload_bytes, elapsed)
    finally:
        await nc.close()



async def failover(cluster: NatsCluster, stream: str, kills: int, *, timeout_s: float = 60) -> dict:
    """Median time from SIGKILL of the stream leader to the next acknowledged publish (sent after
    the kill). The client knows every server and reconnects on its own; the killed server is
    restarted and every replica made current again before the next kill."""
    import nats

    await cluster.stream_leader_url(stream)
    nc = await nats.connect([n.url for n in cluster.nodes], connect_timeout=1, reconnect_time_wait=0.05,
                            max_reconnect_attempts=-1, error_cb=_quiet)
    js = nc.jetstream(timeout=1)
    acks: list[tuple[float, float]] = []
    errors = [0]
    stop = asyncio.Event()

    async def probe() -> None:
        subject = f"{stream.lower()}.data"
        while not stop.is_set():
            sent = time.monotonic()
            try:
                await js.publish(subject, b"p" * 100, timeout=1)
                acks.append((sent, time.monotonic()))
            except Exception:  # counted; the next publish tries again
                errors[0] += 1
                await asyncio.sleep(0.01)

    def first_ack_sent_after(t: float) -> float | None:
        return next((acked for sent, acked in acks if sent >= t), None)

    times_s: list[float] = []
    task = asyncio.ensure_future(probe())
    try:
        for _ in range(kills):
            await cluster.wait_streams_current([stream])
            deadline = time.monotonic() + 30
            while first_ack_sent_after(time.monotonic() - 0.5) is None:
                if time.monotonic() > deadline:
                    raise TimeoutError("no acknowledged publishes before the kill")
                await asyncio.sleep(0.05)
            leader = await cluster.stream_leader(stream)
            killed_at = time.monotonic()
            cluster.kill(leader)
            while (acked := first_ack_sent_after(killed_at)) is None:
                if time.monotonic() - killed_at > timeout_s:
                    raise TimeoutError(f"no acknowledged publish {timeout_s} s after killing {leader}")
                await asyncio.sleep(0.01)
            times_s.append(acked - killed_at)
            cluster.restart(leader)
            await cluster.wait_client_port(leader)
        await cluster.wait_streams_current([stream])
    finally:
        stop.set()
        await asyncio.gather(task, return_exceptions=True)
        await nc.close()
    return {"median_s": median(times_s), "samples_s": times_s, "publish_errors": errors[0]}


async def restart(cluster: NatsCluster, streams: list[str], name: str | None = None) -> dict:
    """Restart one server after SIGKILL and after SIGTERM: seconds from launch to accepting
    clients, and to every stream current again."""
    name = name or cluster.nodes[-1].name
    await cluster.wait_streams_current(streams)
    store_bytes = cluster.store_bytes(name)
    out: dict = {"server": name, "store_bytes": store_bytes}
    for label, sig in (("kill", signal.SIGKILL), ("term", signal.SIGTERM)):
        out[f"{label}_stop_s"] = cluster.kill(name, sig)
        start = time.monotonic()
        cluster.restart(name)
        await cluster.wait_client_port(name)
        out[f"after_{label}_serving_s"] = time.monotonic() - start
        await cluster.wait_streams_current(streams)
        out[f"after_{label}_current_s"] = time.monotonic() - start
    return out
