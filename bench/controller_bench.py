"""The controller quorum's cost and benefit (issue 26): one controller against a quorum
of three, side by side in one run, each on its own local cluster of 3 brokers.

Rows, per controller count:
- ``topic creations/s`` and ``CreateTopics p50/p99``: ``--topics`` topics (1 partition,
  replication factor 3) created one at a time through a broker, which forwards each to the
  active controller; a call returns once the controller committed the topic to its
  metadata log (one controller: ``metadata.log`` written and fsynced; a quorum: a majority
  has the record) and the brokers were told.
- ``raft commit latency p50/p99`` and ``avg/max``: ms from a proposal to its commit on
  the active controller, over the creations (its /metrics: Kafka's
  ``commit-latency-avg``/``-max`` and Tidewater's p50/p99 of the same samples; a quorum
  only: one controller has no Raft log, its commit is the metadata.log fsync inside
  CreateTopics).
- ``controller failover``: SIGKILL the active controller, then time until a metadata
  change (a CreateTopics) succeeds again. One controller is started again at once, as a
  supervisor (systemd, Docker's restart policy) would; a quorum elects a standby.
- ``controller + leader failover``: SIGKILL the active controller and the broker leading
  a probe partition at the same moment; time from the kills to the first acks=all write
  acknowledged after them (a prober writes one record at a time), i.e. until a broker
  failure is handled again. One controller is started again at once.

    .venv/bin/python bench/controller_bench.py [--topics 50] [--kills 3] [--controllers 1,3]

Prints one table and the machine; medians over ``--kills`` for the failover rows.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.bench_common import format_table, latency_summary, machine_description, median
from bench.tidewater_side import TidewaterCluster, _pid_running, _Prober

PROBE_TOPIC = "controller-bench-probe"
FAILOVER_TIMEOUT_S = 90.0


def active_controller_name(cluster: TidewaterCluster) -> str:
    """The process name of the controller that leads (``controller`` when alone)."""
    names = [n for n in cluster.local.process_names() if n.startswith("controller")]
    if names == ["controller"]:
        return "controller"
    deadline = time.monotonic() + FAILOVER_TIMEOUT_S
    while True:
        try:
            leader = cluster.admin.describe_metadata_quorum().leader_id
        except Exception:  # no leader known yet: ask again
            leader = -1
        if leader >= 0:
            return f"controller-{leader}"
        if time.monotonic() > deadline:
            raise TimeoutError("no metadata quorum leader")
        time.sleep(0.1)


COMMIT_STATS = ("p50", "p99", "avg", "max")


def raft_commit_latency_ms(cluster: TidewaterCluster, name: str) -> dict[str, float] | None:
    """``tidewater_raft_commit_latency_*`` (p50, p99, avg, max) on controller ``name``'s
    /metrics."""
    port = cluster.local.process(name)["metrics_port"]
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    found: dict[str, float] = {}
    for line in text.splitlines():
        for stat in COMMIT_STATS:
            if line.startswith(f"tidewater_raft_commit_latency_{stat} "):
                found[stat] = float(line.split()[1])
    return found if set(found) == set(COMMIT_STATS) else None


def create_until_ok(cluster: TidewaterCluster, name: str, deadline: float) -> float:
    """Try CreateTopics until it succeeds; the monotonic time of the success."""
    from tidewater.proto.errors import TidewaterError

    while True:
        try:
            cluster.admin.create_topic(name, 1, 1, None)
            return time.monotonic()
        except TidewaterError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.02)


def creations(cluster: TidewaterCluster, topics: int, prefix: str) -> dict:
    latencies_ms = []
    started = time.monotonic()
    for i in range(topics):
        t0 = time.perf_counter()
        cluster.admin.create_topic(f"{prefix}-{i}", 1, 3, None)
        latencies_ms.append((time.perf_counter() - t0) * 1000)
    elapsed_s = time.monotonic() - started
    return {"per_s": topics / elapsed_s, "latency": latency_summary(latencies_ms)}


def wait_dead(pids: list[int], timeout_s: float = 10) -> None:
    deadline = time.monotonic() + timeout_s
    while any(_pid_running(pid) for pid in pids):
        if time.monotonic() > deadline:
            raise TimeoutError(f"processes {pids} still running after SIGKILL")
        time.sleep(0.01)


def restart_if_alone(cluster: TidewaterCluster, name: str) -> None:
    from tidewater.tools.local_cluster import LocalClusterError

    if name == "controller":
        try:  # reaps the child, so that start() does not find it running
            cluster.local.kill(name, "KILL")
        except LocalClusterError:
            pass
        cluster.local.start(name)


def controller_failover(cluster: TidewaterCluster, kills: int) -> list[float]:
    times_s = []
    for k in range(kills):
        name = active_controller_name(cluster)
        killed_at = time.monotonic()
        cluster.local.kill(name, "KILL")
        restart_if_alone(cluster, name)
        done = create_until_ok(cluster, f"after-controller-kill-{k}", killed_at + FAILOVER_TIMEOUT_S)
        times_s.append(done - killed_at)
        if name != "controller":
            cluster.local.start(name)
    return times_s


def controller_and_leader_failover(cluster: TidewaterCluster, kills: int) -> list[float]:
    times_s = []
    prober = _Prober(cluster.bootstrap, PROBE_TOPIC)
    prober.start()
    try:
        for _ in range(kills):
            cluster.ensure_all_running()
            cluster.wait_full_isr(PROBE_TOPIC)
            prober.wait_acking()
            name = active_controller_name(cluster)
            leader = cluster.leader_of(PROBE_TOPIC)
            pids = [cluster.local.process(name)["pid"], cluster.local.process(leader)["pid"]]
            # Both signals at once, not LocalCluster.kill (which waits for each death): a
            # write sent after ``killed_at`` can only be answered by a new leader.
            killed_at = time.monotonic()
            for pid in pids:
                os.kill(pid, signal.SIGKILL)
            wait_dead(pids)
            restart_if_alone(cluster, name)
            deadline = killed_at + FAILOVER_TIMEOUT_S
            while (acked := prober.first_ack_sent_after(killed_at)) is None:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"no acknowledged write {FAILOVER_TIMEOUT_S} s after "
                                       f"killing {name} and broker {leader}")
                time.sleep(0.01)
            times_s.append(acked - killed_at)
            if name != "controller":
                cluster.local.start(name)
            cluster.start_broker(leader)
        cluster.wait_full_isr(PROBE_TOPIC)
    finally:
        prober.stop()
    return times_s


def measure(controllers: int, topics: int, kills: int) -> dict:
    with tempfile.TemporaryDirectory(prefix=f"controller-bench-{controllers}-") as directory:
        cluster = TidewaterCluster(directory, brokers=3, controllers=controllers)
        cluster.start()
        try:
            cluster.create_topic(PROBE_TOPIC)
            made = creations(cluster, topics, "created")
            commit = (raft_commit_latency_ms(cluster, active_controller_name(cluster))
                      if controllers > 1 else None)
            alone = controller_failover(cluster, kills)
            together = controller_and_leader_failover(cluster, kills)
        finally:
            cluster.stop()
    return {"creations": made, "commit_ms": commit, "failover_s": alone,
            "together_s": together}


def table(results: dict[int, dict]) -> str:
    counts = sorted(results)
    header = ["metric"] + [f"{n} controller{'s' if n > 1 else ''}" for n in counts]

    def row(label: str, cell) -> list[str]:
        return [label] + [cell(results[n]) for n in counts]

    rows = [
        row("topic creations/s", lambda r: f"{r['creations']['per_s']:.1f}"),
        row("CreateTopics p50 ms", lambda r: f"{r['creations']['latency'].p50_ms:.1f}"),
        row("CreateTopics p99 ms", lambda r: f"{r['creations']['latency'].p99_ms:.1f}"),
        row("raft commit latency p50/p99 ms",
            lambda r: "-" if r["commit_ms"] is None
            else f"{r['commit_ms']['p50']:.1f} / {r['commit_ms']['p99']:.1f}"),
        row("raft commit latency avg/max ms",
            lambda r: "-" if r["commit_ms"] is None
            else f"{r['commit_ms']['avg']:.1f} / {r['commit_ms']['max']:.1f}"),
        row("controller failover, median s",
            lambda r: f"{median(r['failover_s']):.2f} ({', '.join(f'{t:.2f}' for t in r['failover_s'])})"),
        row("controller + leader failover, median s",
            lambda r: f"{median(r['together_s']):.2f} ({', '.join(f'{t:.2f}' for t in r['together_s'])})"),
    ]
    return format_table(header, rows, [False] + [True] * len(counts))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--topics", type=int, default=50)
    parser.add_argument("--kills", type=int, default=3)
    parser.add_argument("--controllers", default="1,3",
                        help="comma-separated controller counts, each its own cluster")
    args = parser.parse_args(argv)
    counts = [int(n) for n in args.controllers.split(",")]
    results = {n: measure(n, args.topics, args.kills) for n in counts}
    machine = machine_description()
    print(f"controller bench: {args.topics} topics, {args.kills} kills; "
          f"{machine.get('cpu_model')}, {machine.get('nproc')} cpus, load {os.getloadavg()[0]:.1f}")
    print(table(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
