"""Run one chaos experiment against a cluster and write everything to ``--out``.

Sequence: make sure the topic exists with every partition led; start the
metrics scraper, the leader monitor and the producers; apply the seeded plan
(``schedule.py``), undoing each fault after its hold time (a fault whose
undo is slow, e.g. a restart, pushes the rest of the plan later, so each
fault keeps its planned hold and gap); stop the producers
and wait for every attempt to resolve; heal everything (whatever state chaos
or anyone else left); wait until every partition has its full ISR and every
replica has caught up; read every partition back; compare replicas below the
HW from their data folders; judge (``verdict.py``); copy the data folders.
With ``transactional_rate_per_s`` (``--transactional``) the exactly-once app of
``txn_workload.py`` runs beside the producers on ``<topic>-txn-in`` and
``<topic>-txn-out``; after the group it finishes its input, its output is read
with read_committed and judged (``verdict.judge_transactional``).

Output folder::

    run.json        parameters, the plan, bootstrap, start/end times
    faults.jsonl    one line per action: {"unix_ms", "elapsed_s", "action", "node",
                    "fault", "target", "ok", "error"}; action is kill, start, pause,
                    unpause, isolate, heal (also "heal-all" steps at the end)
    acks.jsonl      the ack log (``tide produce --ack-log`` format)
    leaders.jsonl   the leader monitor's samples (monitor.py)
    metrics/        the scraper's history (client/scrape.py format)
    data/<node>/    copies of each node's data folder, taken after the verdict
    verdict.json    the verdict (verdict.py), and verdict.txt the printed table
"""

from __future__ import annotations

import json
import random
import shutil
import sys
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

from tidewater.client.admin import AdminClient, NewTopic, PartitionDescription
from tidewater.client.consumer import Consumer, offsets_of_every
from tidewater.client.metadata import TopicPartition
from tidewater.proto import tidewater_pb2 as pb
from tidewater.proto.errors import RequestTimedOutError, TidewaterError
from tidewater.tools.chaos.group_reader import GroupReader
from tidewater.tools.chaos.monitor import LeaderMonitor
from tidewater.tools.chaos.replicas import ReplicaComparison, compare_partition
from tidewater.tools.chaos.schedule import (
    APPLY_ACTION,
    CONTROLLER_FAULTS,
    UNDO_ACTION,
    PlannedFault,
    plan_faults,
)
from tidewater.tools.chaos.targets import (
    ChaosCluster,
    ChaosTargetError,
    broker_id_of,
    controller_node,
)
from tidewater.tools.chaos.txn_workload import OUTPUT_PREFIX, TxnWorkload
from tidewater.tools.chaos.verdict import (
    Verdict,
    compacted_away,
    controller_failovers,
    judge,
    judge_group,
    judge_transactional,
)
from tidewater.tools.chaos.workload import Workload
from tidewater.tools.scrape import BackgroundScraper, Scraper, read_snapshots

SETTLE_TIMEOUT_S = 180.0
READ_BACK_TIMEOUT_S = 120.0
# How long the faults wait for the transactional app's first commit.
TXN_FIRST_COMMIT_WAIT_S = 60.0


# A compacted chaos topic: small segments rolled every 2 s, and a dirty segment
# cleaned once 2 s old whatever its ratio (max.compaction.lag.ms), so the cleaner
# (every log.cleaner.backoff.ms) rewrites segments while faults happen.
COMPACTED_TOPIC_CONFIGS = {"cleanup.policy": "compact", "segment.bytes": "65536",
                           "segment.ms": "2000", "max.compaction.lag.ms": "2000",
                           "min.cleanable.dirty.ratio": "0.01", "delete.retention.ms": "1000"}


@dataclass
class ChaosOptions:
    topic: str = "chaos"
    duration_s: float = 60.0
    seed: int = 1
    out_dir: Path = Path("chaos-out")
    partitions: int = 3
    replication_factor: int = 3
    min_insync_replicas: int = 2
    producers: int = 2
    rate_per_s: float = 200.0
    scrape_interval_ms: int = 1000
    warmup_s: float = 5.0
    cooldown_s: float = 5.0
    hold_s: tuple[float, float] = (2.0, 8.0)
    gap_s: tuple[float, float] = (1.0, 4.0)
    fault_weights: dict[str, int] | None = None
    settle_timeout_s: float = SETTLE_TIMEOUT_S
    idempotent: bool = False  # idempotent producers, 5 in flight, retries (workload.py)
    # > 0: a compacted topic written with this many keys (COMPACTED_TOPIC_CONFIGS)
    compacted_keys: int = 0
    # A consume-transform-produce app with Kafka transactions beside the producers
    # (txn_workload.py), fed this many input records per second; 0: none.
    transactional_rate_per_s: float = 0.0
    log: TextIO = field(default=sys.stderr)


class FaultLog:
    """faults.jsonl, plus which nodes are impaired right now (for the monitor)."""

    def __init__(self, path: Path, started_monotonic: float) -> None:
        self._file = open(path, "a", encoding="utf-8")
        self._started = started_monotonic
        self._lock = threading.Lock()
        self.impaired: dict[str, str] = {}  # node -> action that impaired it
        self.entries: list[dict[str, object]] = []

    def impaired_brokers(self) -> set[int]:
        with self._lock:
            return {b for b in map(broker_id_of, self.impaired) if b is not None}

    def record(self, action: str, node: str, *, fault: str = "", target: int | str | None = None,
               ok: bool = True, error: str = "") -> dict[str, object]:
        entry: dict[str, object] = {"unix_ms": int(time.time() * 1000),
                 "elapsed_s": round(time.monotonic() - self._started, 3),
                 "action": action, "node": node, "fault": fault, "target": target,
                 "ok": ok, "error": error}
        with self._lock:
            if ok and action in ("kill", "pause", "isolate"):
                self.impaired[node] = action
            elif ok and action in ("start", "unpause", "heal"):
                self.impaired.pop(node, None)
            self.entries.append(entry)
            self._file.write(json.dumps(entry) + "\n")
            self._file.flush()
        return entry

    def close(self) -> None:
        self._file.close()


FIRST_CALL_RETRY_S = 60.0


class ChaosRun:
    def __init__(self, cluster: ChaosCluster, options: ChaosOptions) -> None:
        self.cluster = cluster
        self.opt = options
        self.out = Path(options.out_dir)
        self.run_id = f"chaos{options.seed}-{uuid.uuid4().hex[:8]}"
        self.bootstrap = cluster.bootstrap()
        self.security = cluster.client_security()  # TLS options of every client made here
        self.partitions: list[int] = []
        self.plan: list[PlannedFault] = []
        # Which standby a "standby" controller fault hits: seeded, apart from the plan.
        self._standby_rng = random.Random(options.seed ^ 0xC0DE)

    def say(self, text: str) -> None:
        print(f"chaos: {text}", file=self.opt.log, flush=True)

    # ------------------------------------------------------------------ steps

    def ensure_topic(self, admin: AdminClient) -> None:
        o = self.opt
        configs = {"min.insync.replicas": str(o.min_insync_replicas)}
        if o.compacted_keys:
            configs.update(COMPACTED_TOPIC_CONFIGS)
        # A cluster that just turned healthy on a loaded host may miss the first calls'
        # deadline (a TLS handshake not done in time): retry for a while, not for ever.
        deadline = time.monotonic() + FIRST_CALL_RETRY_S
        while True:
            try:
                errors = admin.create_topics([NewTopic(o.topic, o.partitions,
                                                       o.replication_factor, configs)])
                break
            except TidewaterError as e:
                if time.monotonic() >= deadline:
                    raise
                self.say(f"create topic {o.topic}: {' '.join(str(e).split())}; retrying")
                time.sleep(2)
        error = errors.get(o.topic)
        if error is not None and getattr(error, "error_code", None) != pb.TOPIC_ALREADY_EXISTS:
            raise ChaosTargetError(f"create topic {o.topic}: {error}")
        self.wait_settled(admin, timeout_s=60)

    def txn_topics(self) -> tuple[str, str]:
        return f"{self.opt.topic}-txn-in", f"{self.opt.topic}-txn-out"

    def ensure_txn_topics(self, admin: AdminClient) -> None:
        o = self.opt
        topics = [NewTopic(name, o.partitions, o.replication_factor,
                           {"min.insync.replicas": str(o.min_insync_replicas)})
                  for name in self.txn_topics()]
        for name, error in admin.create_topics(topics).items():
            if error is not None and getattr(error, "error_code", None) != pb.TOPIC_ALREADY_EXISTS:
                raise ChaosTargetError(f"create topic {name}: {error}")

    def settle_state(self, admin: AdminClient
                     ) -> tuple[list[int], dict[int, PartitionDescription], str]:
        """(partitions, {partition: PartitionDescription}, '' when settled else why not)."""
        (info,) = admin.describe_topics([self.opt.topic], with_replica_state=True)
        parts = {p.partition: p for p in info.partitions}
        for p in info.partitions:
            if p.leader < 0:
                return sorted(parts), parts, f"partition {p.partition} has no leader"
            if set(p.isr) != set(p.replicas):
                return sorted(parts), parts, f"partition {p.partition} ISR {list(p.isr)} of {list(p.replicas)}"
            states = {r.broker: r for r in p.replicas_state}
            leader = states.get(p.leader)
            if leader is None or leader.log_end_offset < 0:
                return sorted(parts), parts, f"partition {p.partition}: leader state unknown"
            for r in p.replicas_state:
                if r.log_end_offset != leader.log_end_offset or r.high_watermark != leader.log_end_offset:
                    return sorted(parts), parts, (
                        f"partition {p.partition}: broker {r.broker} LEO {r.log_end_offset} HW "
                        f"{r.high_watermark}, leader LEO {leader.log_end_offset}")
        return sorted(parts), parts, ""

    def wait_settled(self, admin: AdminClient, timeout_s: float
                     ) -> tuple[dict[int, PartitionDescription], str]:
        deadline = time.monotonic() + timeout_s
        why = "no answer"
        parts: dict[int, PartitionDescription] = {}
        while True:
            try:
                self.partitions, parts, why = self.settle_state(admin)
                if not why:
                    return parts, ""
            except TidewaterError as e:
                why = str(e)
            if time.monotonic() > deadline:
                return parts, why
            time.sleep(0.5)

    @staticmethod
    def unclean_elections(admin: AdminClient) -> int:
        """The controller's unclean election count, -1 when it does not answer."""
        try:
            return admin.describe_cluster().unclean_elections_total
        except TidewaterError:
            return -1

    def leader_of(self, admin: AdminClient, partition: int) -> int:
        try:
            snap = admin.metadata.refresh([self.opt.topic])
            part = snap.topics[self.opt.topic].partitions.get(partition)
            return part.leader if part is not None else -1
        except (TidewaterError, KeyError):
            return -1

    def controller_samples(self, metrics_dir: Path) -> dict[str, list[tuple[int, str]]]:
        """Each controller's good scrapes of the run: (unix_ms, exposition)."""
        samples: dict[str, list[tuple[int, str]]] = {}
        for node in self.cluster.controller_names():
            path = metrics_dir / f"{node}.prom"
            samples[node] = ([(s.unix_ms, s.text) for s in read_snapshots(path) if s.ok]
                             if path.exists() else [])
        return samples

    def controller_for(self, target: int | str, admin: AdminClient, log: FaultLog) -> str:
        """The controller a controller fault hits: the active one (as DescribeCluster names
        it through the brokers), or a standby (seeded pick among the others not impaired
        now); a lone controller for ``controller``, or when the active one is unknown
        (no answer during an election: then the first running one)."""
        names = self.cluster.controller_names()
        if not names:
            raise ChaosTargetError("the cluster has no controller")
        if target == "controller" or len(names) == 1:
            return names[0]
        try:
            active = controller_node(names, admin.describe_cluster().controller_id)
        except TidewaterError:
            active = None
        if target == "active":
            return active or names[0]
        standbys = [n for n in names if n != active and n not in log.impaired] or [
            n for n in names if n != active]
        return self._standby_rng.choice(standbys)

    def apply(self, fault: PlannedFault, admin: AdminClient, log: FaultLog,
              rng_pick: Callable[[], int]) -> str | None:
        """Apply one fault; returns the node impaired (None when it could not be applied)."""
        if fault.kind == "kill_leader":
            leader = self.leader_of(admin, int(fault.target))
            node = f"broker-{leader}" if leader >= 0 else f"broker-{rng_pick()}"
        elif fault.kind in CONTROLLER_FAULTS:
            try:
                node = self.controller_for(fault.target, admin, log)
            except ChaosTargetError as e:
                log.record(APPLY_ACTION[fault.kind], "controller", fault=fault.kind,
                           target=fault.target, ok=False, error=str(e))
                return None
        else:
            node = f"broker-{fault.target}"
        action = APPLY_ACTION[fault.kind]
        try:
            getattr(self.cluster, action)(node)
        except ChaosTargetError as e:
            log.record(action, node, fault=fault.kind, target=fault.target, ok=False, error=str(e))
            self.say(f"{action} {node} failed: {e}")
            return None
        log.record(action, node, fault=fault.kind, target=fault.target)
        self.say(f"{action} {node} ({fault.kind}, hold {fault.hold_s:.1f} s)")
        return node

    def undo(self, fault: PlannedFault, node: str, log: FaultLog) -> None:
        action = UNDO_ACTION[fault.kind]
        try:
            getattr(self.cluster, action)(node)
        except ChaosTargetError as e:
            log.record(action, node, fault=fault.kind, target=fault.target, ok=False, error=str(e))
            self.say(f"{action} {node} failed: {e} (healed at the end)")
            return
        log.record(action, node, fault=fault.kind, target=fault.target)
        self.say(f"{action} {node}")

    def finish_group(self, reader: GroupReader, admin: AdminClient, notes: list[str]
                     ) -> tuple[set[tuple[int, int]], dict[int, list[int]]]:
        """Let the group read to the end offsets and stop it: what it consumed and the
        commits it saw (judged after the read-back: ``judge_group``)."""
        consumer = Consumer(self.bootstrap, **self.security)
        try:
            ends = {tp.partition: off for tp, off in self.end_offsets(consumer).items()}
        except TidewaterError as e:
            ends = {}
            notes.append(f"group: no end offsets: {e}")
        finally:
            consumer.close()
        if ends and not reader.drain(ends, READ_BACK_TIMEOUT_S,
                                     compacted=bool(self.opt.compacted_keys)):
            notes.append(f"group: did not consume to the end offsets within "
                         f"{READ_BACK_TIMEOUT_S:.0f} s")
        reader.stop()
        if reader.failure is not None:
            notes.append(f"group reader died: {reader.failure!r}")
        self.say(f"group reader errors (ridden out): {dict(reader.errors)}")
        return reader.snapshot()

    def end_offsets(self, consumer: Consumer) -> dict[TopicPartition, int]:
        """The end offset of every partition of the topic. After the healing a loaded host
        may miss the first calls' deadline (a TLS handshake not done in time: "connection
        attempt timed out before receiving SETTINGS frame", seen in CI), and a partition
        may have no leader known yet (left out of ``end_offsets``): both are asked again
        for up to FIRST_CALL_RETRY_S, as the topic's creation is; then the last attempt's
        failure is raised."""
        tps = [TopicPartition(self.opt.topic, p) for p in self.partitions]
        failed: list[TidewaterError | None] = [None]  # the last attempt's raised failure

        def fetch(missing: list[TopicPartition]) -> dict[TopicPartition, int]:
            try:
                found = consumer.end_offsets(missing)
                failed[0] = None
            except TidewaterError as e:
                if not e.retriable:
                    raise
                found, failed[0] = {}, e
                self.say(f"end offsets: {' '.join(str(e).split())}; retrying")
            return found

        ends, missing = offsets_of_every(fetch, tps, time.monotonic() + FIRST_CALL_RETRY_S, 2.0)
        if not missing:
            return ends
        raise failed[0] or RequestTimedOutError(
            f"end offsets: no leader answered for {sorted(tp.partition for tp in missing)}")

    def read_back(self) -> tuple[dict[int, list[tuple[int, str]]], str]:
        """Every record of every partition from the start to the HW: partition -> [(offset, value)]."""
        consumer = Consumer(self.bootstrap, auto_offset_reset="earliest", fetch_max_wait_ms=100,
                            **self.security)
        out: dict[int, list[tuple[int, str]]] = {p: [] for p in self.partitions}
        try:
            tps = [TopicPartition(self.opt.topic, p) for p in self.partitions]
            consumer.assign(tps)
            ends = self.end_offsets(consumer)
            consumer.seek_to_beginning()
            deadline = time.monotonic() + READ_BACK_TIMEOUT_S
            while any(consumer.position(tp) < ends[tp] for tp in tps):
                if time.monotonic() > deadline:
                    short = {tp.partition: (consumer.position(tp), ends[tp]) for tp in tps
                             if consumer.position(tp) < ends[tp]}
                    return out, f"read-back incomplete after {READ_BACK_TIMEOUT_S:.0f} s: {short}"
                for r in consumer.poll(timeout_ms=1000):
                    if r.offset < ends[TopicPartition(r.topic, r.partition)]:
                        value = r.value.decode("utf-8", "replace") if r.value is not None else ""
                        out[r.partition].append((r.offset, value))
        except TidewaterError as e:
            return out, f"read-back failed: {e}"
        finally:
            consumer.close()
        return out, ""

    def compare_replicas(self, parts: dict[int, PartitionDescription]
                         ) -> dict[int, ReplicaComparison]:
        data_dirs = self.cluster.data_dirs()
        out: dict[int, ReplicaComparison] = {}
        for p, desc in parts.items():
            leader_state = {r.broker: r for r in desc.replicas_state}.get(desc.leader)
            hw = leader_state.high_watermark if leader_state else -1
            dirs = {b: d for b in desc.replicas if (d := data_dirs.get(f"broker-{b}")) is not None}
            missing = [b for b in desc.replicas if b not in dirs]
            if missing or hw < 0:
                out[p] = ReplicaComparison(False, f"no data folder for brokers {missing}" if missing
                                           else "leader HW unknown")
                continue
            out[p] = compare_partition(dirs, self.opt.topic, p, hw,
                                       compacted=bool(self.opt.compacted_keys))
        return out

    def collect_data(self) -> None:
        for node, src in self.cluster.data_dirs().items():
            dest = self.out / "data" / node
            if dest.exists():
                shutil.rmtree(dest)
            try:
                shutil.copytree(src, dest, ignore_dangling_symlinks=True)
            except (OSError, shutil.Error) as e:  # a file replaced while copying: keep the rest
                self.say(f"copy of {node} data incomplete: {e}")

    # ------------------------------------------------------------------ the run

    def run(self) -> Verdict:
        o = self.opt
        if (self.out / "run.json").exists():
            raise ChaosTargetError(f"{self.out} already holds a chaos run; choose another --out")
        self.out.mkdir(parents=True, exist_ok=True)
        notes: list[str] = []
        admin = AdminClient(self.bootstrap, request_timeout_ms=5000, **self.security)
        try:
            self.ensure_topic(admin)
            if o.transactional_rate_per_s > 0:
                self.ensure_txn_topics(admin)
            if not self.partitions:
                raise ChaosTargetError(f"topic {o.topic} has no partitions")
            unclean_before = self.unclean_elections(admin)
            self.plan = plan_faults(o.seed, o.duration_s, self.cluster.broker_ids(), len(self.partitions),
                                    warmup_s=o.warmup_s, cooldown_s=o.cooldown_s, hold_s=o.hold_s,
                                    gap_s=o.gap_s, weights=o.fault_weights,
                                    controllers=len(self.cluster.controller_names()))
            started_unix_ms = int(time.time() * 1000)
            run_info = {"run_id": self.run_id, "seed": o.seed, "duration_s": o.duration_s,
                        "cluster": self.cluster.kind, "bootstrap": self.bootstrap, "topic": o.topic,
                        "partitions": self.partitions, "producers": o.producers,
                        "rate_per_s": o.rate_per_s, "started_unix_ms": started_unix_ms,
                        "plan": [f.to_json() for f in self.plan]}
            (self.out / "run.json").write_text(json.dumps(run_info, indent=2) + "\n")
            self.say(f"run {self.run_id}: {len(self.plan)} faults over {o.duration_s:.0f} s "
                     f"on topic {o.topic} ({len(self.partitions)} partitions), output {self.out}")

            started = time.monotonic()
            log = FaultLog(self.out / "faults.jsonl", started)
            scraper = None
            targets = self.cluster.metrics_targets()
            if targets:
                scraper = BackgroundScraper(Scraper(targets, self.out / "metrics",
                                                    interval_ms=o.scrape_interval_ms))
                scraper.start()
            monitor = LeaderMonitor(self.bootstrap, o.topic, self.partitions,
                                    impaired_brokers=log.impaired_brokers,
                                    timeline_path=self.out / "leaders.jsonl",
                                    security=self.security)
            workload = Workload(self.bootstrap, o.topic, self.partitions, run_id=self.run_id,
                                ack_log_path=self.out / "acks.jsonl", producers=o.producers,
                                rate_per_s=o.rate_per_s, security=self.security,
                                idempotent=o.idempotent, keys=o.compacted_keys)
            txn: TxnWorkload | None = None
            if o.transactional_rate_per_s > 0:
                source, sink = self.txn_topics()
                txn = TxnWorkload(self.cluster.kafka_bootstrap(), source, sink,
                                  run_id=self.run_id, rate_per_s=o.transactional_rate_per_s,
                                  security=self.security)
            group_reader = GroupReader(self.bootstrap, o.topic, self.partitions,
                                       f"chaos-{self.run_id}", security=self.security)
            monitor.start()
            workload.start()
            group_reader.start()
            delay_s = 0.0
            if txn is not None:
                txn.start()
                # The plan's clock starts at the app's first commit: on a loaded machine
                # finding its coordinator and joining its group took longer than the
                # whole plan, and no fault fell on a transaction.
                if not txn.wait_first_commit(TXN_FIRST_COMMIT_WAIT_S):
                    self.say(f"transactional app: no transaction committed within "
                             f"{TXN_FIRST_COMMIT_WAIT_S:.0f} s; the faults start anyway")
                delay_s = time.monotonic() - started
            rng = random.Random(o.seed ^ 0x5EED)
            pick = lambda: rng.choice(self.cluster.broker_ids())  # noqa: E731
            try:
                # Plan times are relative: a slow restart shifts the rest of the plan
                # instead of squeezing later faults to nothing, so every fault keeps
                # its hold and gap and a run may last longer than duration_s.
                for fault in self.plan:
                    time.sleep(max(0.0, started + delay_s + fault.start_s - time.monotonic()))
                    node = self.apply(fault, admin, log, pick)
                    # The hold counts from the fault, not from the lookup of its target
                    # (a leader or the active controller: a call that may take seconds).
                    applied_at = time.monotonic()
                    time.sleep(max(0.0, applied_at + fault.hold_s - time.monotonic()))
                    if node is not None:
                        self.undo(fault, node, log)
                    delay_s = max(delay_s, time.monotonic() - started - fault.end_s)
                time.sleep(max(0.0, started + delay_s + o.duration_s - time.monotonic()))
            finally:
                self.say(f"stopping producers ({workload.counts()})")
                workload.stop()
                try:
                    for action in self.cluster.heal_everything():
                        verb, _, node = action.partition(" ")
                        log.record(verb, node, fault="heal-all")
                        self.say(f"heal-all: {action}")
                except ChaosTargetError as e:  # judge anyway: the evidence matters most now
                    notes.append(f"healing failed: {e}")
                    self.say(f"healing failed: {e}")
            if workload.failure is not None:
                notes.append(f"a producer thread died: {workload.failure!r}")
            self.say("waiting for full ISRs and caught-up replicas")
            parts, why = self.wait_settled(admin, o.settle_timeout_s)
            if why:
                notes.append(f"not settled after {o.settle_timeout_s:.0f} s: {why}")
            unclean_after = self.unclean_elections(admin)
            if unclean_before >= 0 and unclean_after > unclean_before:
                # Chaos topics never allow unclean elections: one is a lost-data risk.
                notes.append(f"{unclean_after - unclean_before} unclean leader election(s) during the run")
            monitor.stop()
            group_consumed, group_committed = self.finish_group(group_reader, admin, notes)
            txn_outputs: list[str] = []
            txn_inputs: list[str] | None = None
            if txn is not None:
                self.say(f"transactional app: finishing the input ({txn.counts()})")
                why = txn.finish(READ_BACK_TIMEOUT_S)
                if why:
                    notes.append(why)
                if txn.failure is not None:
                    notes.append(f"a transactional workload thread died: {txn.failure!r}")
                txn_outputs, why = txn.read_output()
                if why:
                    notes.append(why)
                txn_inputs, why = txn.read_input()
                if why:
                    notes.append(why)
                self.say(f"transactional app errors (ridden out): {dict(txn.errors)}")
            consumed, why = self.read_back()
            if why:
                notes.append(why)
            replicas = self.compare_replicas(parts) if parts else {}
            if scraper is not None:
                try:
                    scraper.stop()
                except RuntimeError as e:
                    notes.append(str(e))
            log.close()
            verdict = judge(partitions=self.partitions, value_prefix=workload.value_prefix,
                            sent=workload.sent, acked=workload.acked, consumed=consumed,
                            no_leader_s=monitor.snapshot(), replicas=replicas,
                            failed_attempts=sum(workload.errors.values()), notes=notes,
                            keys=o.compacted_keys)
            excused = (compacted_away(workload.acked, consumed, workload.value_prefix,
                                      o.compacted_keys) if o.compacted_keys else set())
            verdict.group = judge_group(group_reader.group_id, workload.acked, group_consumed,
                                        group_committed, excused)
            if txn is not None:
                counts = txn.counts()
                verdict.transactional = judge_transactional(
                    input_prefix=txn.input_prefix, output_prefix=OUTPUT_PREFIX, sent=txn.sent,
                    acked=txn.acked, outputs=txn_outputs, inputs=txn_inputs,
                    transactions_committed=counts["committed"],
                    transactions_aborted=counts["aborted"])
            verdict.controllers = controller_failovers(
                self.controller_samples(self.out / "metrics"))
            result = verdict.to_json()
            result["errors_by_type"] = dict(workload.errors)
            if txn is not None:
                result["transactional_errors_by_type"] = dict(txn.errors)
                result["transactional_producers_created"] = txn.producers_created
                result["transactional_commits_unix_ms"] = [txn.first_commit_unix_ms,
                                                           txn.last_commit_unix_ms]
            result["faults_applied"] = sum(1 for e in log.entries if e["action"] in APPLY_ACTION.values()
                                           and e["ok"] and e["fault"] != "heal-all")
            (self.out / "verdict.json").write_text(json.dumps(result, indent=2) + "\n")
            (self.out / "verdict.txt").write_text(verdict.table() + "\n")
            self.collect_data()
            return verdict
        finally:
            admin.close()
