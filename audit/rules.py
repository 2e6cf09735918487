"""The audit's rules: each a named check over the data sources, with its violations.

Every rule returns a RuleResult whose ``violations`` DataFrame has the same
columns (VIOLATION_COLUMNS): rule, broker_id, topic, partition, offset,
detail. A rule passes when it has no violation. Heavy work (every batch,
every record) runs in Spark; the few per-replica summaries that need a
sequential replay (leader-epoch histories: one entry per epoch change) are
collected to the driver.

| rule | checks | input |
|---|---|---|
| batch_crc_and_framing | every batch frames and passes its CRC32C | log |
| offsets_contiguous | each batch starts right after the previous one, per replica | log |
| epochs_monotonic | batch leader epochs never decrease, per replica | log |
| epoch_checkpoint_matches_log | leader-epoch-checkpoint = the epoch cache the log implies | log, checkpoints |
| offset_checkpoints_within_log | log-start <= HW <= LEO and recovery point <= LEO | log, checkpoints |
| replicas_agree_below_hw | below the HW every replica (of one topic ID) covering an offset holds the identical batch (offsets, epoch, CRC) | log, checkpoints, metrics |
| epoch_histories_agree | replicas' (of one topic ID) epoch histories give each common epoch the same start offset | log |
| hw_monotonic_per_leader_epoch | a leader's HW never goes back within one leader epoch | metrics |
| hw_not_above_leo | HW <= LEO in every sample | metrics |
| acked_writes_present | every acks=all record is held by a replica at its offset, same key and value | ack logs, log (records) |
| producer_sequences_contiguous | within each producer id and epoch, a replica's batches carry contiguous sequences, none repeated | log |
| transactions_end_with_markers | every transaction ends with a COMMIT or ABORT marker in every replica it wrote to (open at the log end: reported, not failed) | log (control batches) |
| transaction_markers_agree | replicas of a partition hold the same markers (offset, producer, type) below the committed HW | log, checkpoints, metrics |
| read_committed_excludes_aborted | the read_committed view (control batches and the `.txnindex`'s aborted ranges skipped) holds no batch of an aborted transaction | log, .txnindex |

The transaction rules (transactions.py) run on the driver over the transactional
batches only (attribute bit 4), read as rows when the reader counted batches with a
producer id and sequence (every transactional data batch has both); a control batch's
type is read from its record's key in the segment file.

Compacted partitions (listed in some broker's ``cleaner-offset-checkpoint``) are held
to what compaction keeps: replicas may differ in which old records they still hold,
never in a record's offset, key or value. There, offsets may skip forward (not
overlap); replicas are compared record by record below the HW instead of batch by
batch; an epoch's checkpoint entry may start before its first remaining batch and
epoch histories from the logs are not compared; an acknowledged record no replica
holds is lost only if it is its key's latest acknowledged record and not a tombstone.

The epoch cache a log implies is the protocol's ``assign(epoch, base_offset)``
replayed over its batches in file order (what a follower does). When epochs
never decrease this is exactly "the first batch of each epoch". A checkpoint
may end with one more entry than that: a leader's ``(new epoch, LEO)`` before
it wrote anything. Epoch histories (rule epoch_histories_agree) are compared
from the logs, not the checkpoints, so one broken checkpoint file is reported
once (by epoch_checkpoint_matches_log) rather than twice.

Topic incarnations: replicas are compared only with replicas of the same
topic ID (``partition.metadata``; "" for logs written before topic IDs): a
topic deleted and created again is another partition for the rules that
compare replicas (replicas_agree_below_hw, epoch_histories_agree, the
committed HW). A metrics sample carries no topic ID: it counts towards the
committed HW only when one incarnation of its partition is on disk.

The committed HW of a partition is the largest HW any replica checkpointed or
any metrics sample showed: below it every replica in sync must agree. A
replica that ends below the HW is reported as lagging (information), and
batches at or above the HW as uncommitted (information), never as violations.
"""

from __future__ import annotations

import functools
import os
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from pyspark.sql import DataFrame, SparkSession, Window
from pyspark.sql import functions as F

from tidewater.audit.epochs import (
    assign_epoch,
    compare_compacted_epoch_checkpoint,
    compare_epoch_checkpoint,
    diverging_epochs,
)
from tidewater.audit.reader import (
    FRAMED_STATUSES,
    RULE_BATCH_CRC,
    RULE_EPOCHS,
    RULE_OFFSETS,
    epoch_drop_problem,
    offset_order_problem,
)
from tidewater.audit.transactions import (
    ATTR_CONTROL,
    ATTR_TRANSACTIONAL,
    TXN_INDEX_SUFFIX,
    AbortedTransaction,
    ControlKeyError,
    ReplicaTransactions,
    TxnBatch,
    markers_disagree,
    read_committed_leaks,
    read_control_type,
    read_txn_index,
    replica_transactions,
)

VIOLATION_COLUMNS = ("rule", "broker_id", "topic", "partition", "offset", "detail")
VIOLATION_DDL = ("rule string, broker_id int, topic string, partition int, offset long, "
                 "detail string")
REPLICA_KEYS = ["broker_id", "topic", "partition"]
PARTITION_KEYS = ["topic", "partition"]
INCARNATION_KEYS = ["topic", "partition", "topic_id"]  # replicas compared only within one

# Metric names (broker/metrics.py); older or plain exports without "replica_" also match.
BROKER_METRIC_PREFIXES = ("tidewater_broker_replica_", "tidewater_broker_")
REPLICA_GAUGES = ("log_end_offset", "high_watermark", "log_start_offset", "leader_epoch",
                  "isr_size", "is_leader")


@dataclass
class RuleResult:
    name: str
    description: str
    checked: int                 # items the rule looked at (batches, pairs, samples, acks)
    violations: DataFrame        # VIOLATION_COLUMNS (lazy; counted once for all rules)
    violation_count: int | None = None  # None: counted by run_rules' one counting job
    skipped: str | None = None   # why the rule could not run (missing input); passes
    info: dict = field(default_factory=dict)

    @property
    def passed(self) -> bool:
        return not self.violation_count


@dataclass
class AuditInputs:
    spark: SparkSession
    # tidewater-log, batch level: loaded when a rule first reads batch rows (most runs
    # read none: each load costs a Python planner process)
    load_batches: Callable[[], DataFrame]
    segments: DataFrame                # tidewater-log, segment level (small: cache it)
    checkpoints: DataFrame             # tidewater-checkpoints
    records: DataFrame | None = None   # tidewater-log, record level (needed for acks)
    metrics: DataFrame | None = None   # tidewater-metrics
    acks: DataFrame | None = None      # ack_id, topic, partition, offset, key, value, acks
    # (topic, partition) the brokers' log cleaners compact (reader.compacted_partitions)
    compacted: frozenset[tuple[str, int]] = frozenset()
    # tidewater-log level disagreement over the given incarnations (topic, partition,
    # topic_id); None: replicas_agree_below_hw compares every batch row in Spark instead
    disagreements: Callable[[list[tuple[str, int, str]]], DataFrame] | None = None

    @functools.cached_property
    def batches(self) -> DataFrame:
        return self.load_batches()


def _compacted(inputs: AuditInputs):
    """A column: the row's (topic, partition) is a compacted one."""
    condition = F.lit(False)
    for topic, partition in sorted(inputs.compacted):
        condition = condition | ((F.col("topic") == topic) & (F.col("partition") == partition))
    return condition


def _violations(df: DataFrame, rule: str, broker, topic, partition, offset, detail) -> DataFrame:
    return df.select(
        F.lit(rule).alias("rule"), broker.cast("int").alias("broker_id"),
        topic.cast("string").alias("topic"), partition.cast("int").alias("partition"),
        offset.cast("long").alias("offset"), detail.cast("string").alias("detail"))


def _local_violations(spark: SparkSession, rule: str, rows: list[tuple]) -> DataFrame:
    """Violations found on the driver: rows of (broker_id, topic, partition, offset, detail)."""
    return spark.createDataFrame([(rule, *r) for r in rows], VIOLATION_DDL)


def _driver_violations(derived: Derived, rule: str, rows: list[tuple]) -> DataFrame:
    """_local_violations, or the run's one empty frame when there are none (most runs).

    Each frame costs the driver round trips to the JVM (~20 ms); a passing rule needs none.
    """
    if not rows:
        return derived.no_violations
    return _local_violations(derived.inputs.spark, rule, rows)


def _result(name: str, description: str, checked: int, violations: DataFrame,
            **kwargs) -> RuleResult:
    return RuleResult(name, description, checked, violations, **kwargs)


# ---------------------------------------------------------------- derived frames


@dataclass
class TxnReplica:
    """One replica's transactional batches (Derived.transactional)."""

    segment_dir: str
    batches: list[TxnBatch] = field(default_factory=list)
    key_errors: list[tuple[int, str]] = field(default_factory=list)  # unreadable markers
    replayed: ReplicaTransactions = field(default_factory=ReplicaTransactions)
    index: list[AbortedTransaction] = field(default_factory=list)  # its .txnindex entries


@dataclass(frozen=True)
class ReplicaSummary:
    broker_id: int
    topic: str
    partition: int
    batch_count: int        # whole batches (framing intact)
    row_count: int          # every row, torn and corrupt ones included
    log_start_offset: int
    log_end_offset: int
    topic_id: str = ""      # the replica's incarnation

    @property
    def incarnation(self) -> tuple[str, int, str]:
        return self.topic, self.partition, self.topic_id


class Derived:
    """Frames and small driver-side summaries several rules share, each computed once.

    Spark jobs are what a run costs, so the per-segment summary, the epoch
    changes, the checkpoints and the metrics samples are each collected by one
    job and reused. Order within a segment is decided by the reader, which
    summarizes each segment (tidewater-log level ``segment``: counts, first and
    last whole batch, the batch-level rules' violations, the epoch changes), so
    the batch-level rules cost Spark one row per segment, not one per batch.
    Order across segments is checked here from those summaries.
    replicas_agree_below_hw reads every batch: merged replica by replica in the reader
    (tidewater-log level disagreement), or as rows (``framed``) for logs out of order;
    producer_sequences_contiguous reads batch rows only when the summaries counted
    batches of idempotent producers.
    """

    def __init__(self, inputs: AuditInputs):
        self.inputs = inputs
        # The violations stay in Spark (there may be many); the rest is small.
        segments = inputs.segments.drop("violations").collect()
        self.segment_rows = sorted(segments, key=lambda r: (r.broker_id, r.topic, r.partition,
                                                           r.segment_base_offset))
        per_replica: dict[tuple[int, str, int], list] = defaultdict(list)
        for r in self.segment_rows:
            per_replica[(r.broker_id, r.topic, r.partition)].append(r)
        self.replica_rows = []
        self.total_batches = self.framed_batches = 0
        self.bad_batches = sum(r.bad_batches or 0 for r in self.segment_rows)
        self.offset_order_breaks = sum(r.offset_order_breaks or 0 for r in self.segment_rows)
        self.epoch_drops = sum(r.epoch_drops or 0 for r in self.segment_rows)
        self.idempotent_batches = sum(r.idempotent_batches or 0 for r in self.segment_rows)
        for (broker, topic, partition), segs in per_replica.items():
            whole = [s for s in segs if s.batch_count]
            self.total_batches += sum(s.row_count for s in segs)
            self.framed_batches += sum(s.batch_count for s in segs)
            if whole:
                self.replica_rows.append(ReplicaSummary(
                    broker, topic, partition, sum(s.batch_count for s in segs),
                    sum(s.row_count for s in segs), min(s.log_start_offset for s in whole),
                    max(s.log_end_offset for s in whole), segs[0].topic_id or ""))
        self.topic_ids = {(r.broker_id, r.topic, r.partition): r.topic_id
                          for r in self.replica_rows}
        self.samples = replica_samples(inputs.metrics)
        self.sample_rows = []
        if self.samples is not None:
            self.samples = self.samples.cache()
            self.sample_rows = self.samples.collect()
        self._epoch_logs: dict | None = None
        self._hw: dict | None = None

    @functools.cached_property
    def framed(self) -> DataFrame:
        """The whole batches' rows (status ok or crc_mismatch)."""
        return self.inputs.batches.where(F.col("status").isin(*FRAMED_STATUSES)
                                         & F.col("base_offset").isNotNull())

    @functools.cached_property
    def no_violations(self) -> DataFrame:
        """An empty violations frame, shared by every rule of the run that has none."""
        return _local_violations(self.inputs.spark, "none", [])

    @functools.cached_property
    def checkpoint_rows(self) -> list:
        """Every checkpoint entry; collected when a rule first needs them (one job)."""
        return self.inputs.checkpoints.collect()

    @functools.cached_property
    def replicas(self) -> DataFrame:
        """One row per replica with whole batches: its log start and end offsets."""
        return self.inputs.spark.createDataFrame(
            [(r.broker_id, r.topic, r.partition, r.topic_id, r.log_start_offset,
              r.log_end_offset) for r in self.replica_rows],
            "broker_id int, topic string, partition int, topic_id string, "
            "log_start_offset long, log_end_offset long")

    def segment_boundaries(self) -> list[tuple]:
        """(broker, topic, partition, previous segment's last row, next segment's first row)."""
        out = []
        prev = None
        for r in self.segment_rows:
            if not r.batch_count:
                continue
            if prev is not None and (prev.broker_id, prev.topic, prev.partition) == \
                    (r.broker_id, r.topic, r.partition):
                out.append((r.broker_id, r.topic, r.partition, prev, r))
            prev = r
        return out

    def replica_epoch_logs(self) -> dict[tuple[int, str, int], dict]:
        """Per replica: the epoch cache its log implies, its log start and end offsets."""
        if self._epoch_logs is None:
            # The reader lists each segment's epoch changes: the whole batches whose
            # epoch differs from the previous whole batch's in the segment.
            changes = [(r.broker_id, r.topic, r.partition, r.segment_base_offset, c.position,
                        c.partition_leader_epoch, c.base_offset)
                       for r in self.segment_rows for c in r.epoch_changes]
            logs: dict[tuple[int, str, int], dict] = {}
            for row in self.replica_rows:
                logs[(row.broker_id, row.topic, row.partition)] = {
                    "log_start_offset": row.log_start_offset,
                    "log_end_offset": row.log_end_offset, "cache": [], "last_epoch": None}
            for broker, topic, partition, _segment, _position, epoch, base_offset in \
                    sorted(changes, key=lambda c: c[:5]):
                entry = logs[(broker, topic, partition)]
                assign_epoch(entry["cache"], epoch, base_offset)
                entry["last_epoch"] = epoch
            self._epoch_logs = logs
        return self._epoch_logs

    def ordered_incarnations(self) -> set[tuple[str, int, str]]:
        """The incarnations (topic, partition, topic_id) each of whose logs (one per broker
        and data dir) holds whole batches in strictly increasing base-offset order, across
        its segments too: what reader.replica_disagreements can merge."""
        logs: dict[tuple, list] = defaultdict(list)
        for r in self.segment_rows:
            logs[(r.topic, r.partition, r.topic_id or "", r.broker_id, r.data_dir)].append(r)
        ordered: dict[tuple[str, int, str], bool] = {}
        for key, segments in logs.items():
            last_base = None
            ok = True
            for r in sorted(segments, key=lambda r: (r.segment_base_offset, r.segment)):
                if not r.batch_count:
                    continue
                if r.base_order_breaks or (last_base is not None
                                           and r.first_base_offset <= last_base):
                    ok = False
                    break
                last_base = r.last_base_offset
            ordered[key[:3]] = ordered.get(key[:3], True) and ok
        return {key for key, ok in ordered.items() if ok}

    @functools.cached_property
    def transactional(self) -> dict[tuple[int, str, int, str], TxnReplica]:
        """Per replica (broker, topic, partition, topic_id): its transactional batches,
        replayed (transactions.replica_transactions), and its .txnindex entries."""
        if not self.idempotent_batches:  # no transactional data batch without a sequence
            return {}
        rows = (self.framed
                .where(F.col("attributes").bitwiseAND(ATTR_TRANSACTIONAL) != 0)
                .select("broker_id", "topic", "partition", "topic_id", "segment", "position",
                        "size_bytes", "base_offset", "last_offset", "producer_id",
                        "producer_epoch", "attributes")
                .collect())
        replicas: dict[tuple[int, str, int, str], TxnReplica] = {}
        for r in rows:
            key = (r.broker_id, r.topic, r.partition, r.topic_id or "")
            replica = replicas.setdefault(key, TxnReplica(segment_dir=os.path.dirname(r.segment)))
            control = None
            if r.attributes & ATTR_CONTROL:
                try:
                    control = read_control_type(r.segment, r.position, r.size_bytes)
                except (ControlKeyError, OSError) as e:
                    replica.key_errors.append((r.base_offset, str(e)))
                    continue
            replica.batches.append(TxnBatch(r.base_offset, r.last_offset, r.producer_id,
                                            r.producer_epoch, control))
        for replica in replicas.values():
            replica.replayed = replica_transactions(replica.batches)
            for index in sorted(Path(replica.segment_dir).glob("*" + TXN_INDEX_SUFFIX)):
                replica.index.extend(read_txn_index(index))
        return replicas

    def committed_high_watermarks(self) -> dict[tuple[str, int, str], int]:
        """Per incarnation (topic, partition, topic_id): the largest HW any of its replicas
        checkpointed or any sample showed (samples: only for a partition with one
        incarnation on disk, since a sample does not say which one it saw)."""
        if self._hw is None:
            hw: dict[tuple[str, int, str], int] = {}
            incarnations: dict[tuple[str, int], set[str]] = defaultdict(set)
            for r in self.replica_rows:
                incarnations[(r.topic, r.partition)].add(r.topic_id)
            for r in self.checkpoint_rows:
                if r.kind == "high-watermark" and r.error is None:
                    key = (r.topic, r.partition, r.topic_id or "")
                    hw[key] = max(hw.get(key, -1), r.offset)
            for r in self.sample_rows:
                ids = incarnations.get((r.topic, r.partition), set())
                if r.high_watermark is not None and len(ids) <= 1:
                    key = (r.topic, r.partition, next(iter(ids), ""))
                    hw[key] = max(hw.get(key, -1), int(r.high_watermark))
            self._hw = hw
        return self._hw


# ---------------------------------------------------------------- log rules


def _reader_violations(inputs: AuditInputs, derived: Derived, rule: str,
                       count: int) -> DataFrame:
    """The ``count`` violations of a batch-level rule the reader found (segment summaries)."""
    if not count:
        return derived.no_violations
    found = (inputs.segments.select(*REPLICA_KEYS, F.explode("violations").alias("v"))
             .where(F.col("v.rule") == rule))
    return _violations(found, rule, F.col("broker_id"), F.col("topic"), F.col("partition"),
                       F.col("v.offset"), F.col("v.detail"))


def batch_crc_and_framing(inputs: AuditInputs, derived: Derived) -> RuleResult:
    v = _reader_violations(inputs, derived, RULE_BATCH_CRC, derived.bad_batches)
    return _result(RULE_BATCH_CRC,
                   "Every batch is framed (length, magic) and passes its CRC32C.",
                   derived.total_batches, v, violation_count=derived.bad_batches)


def offsets_contiguous(inputs: AuditInputs, derived: Derived) -> RuleResult:
    v = _reader_violations(inputs, derived, RULE_OFFSETS, derived.offset_order_breaks)
    compacted = inputs.compacted
    if compacted and derived.offset_order_breaks:  # a compacted log may skip offsets
        v = v.where(~(_compacted(inputs) & F.col("detail").startswith("gap:")))
    boundary = [(broker, topic, partition, nxt.first_base_offset,
                 offset_order_problem(nxt.first_base_offset, prev.last_offset))
                for broker, topic, partition, prev, nxt in derived.segment_boundaries()
                if nxt.first_base_offset != prev.last_offset + 1 and not (
                    (topic, partition) in compacted
                    and nxt.first_base_offset > prev.last_offset + 1)]
    if boundary:
        v = v.unionByName(_local_violations(inputs.spark, RULE_OFFSETS, boundary))
    return _result(RULE_OFFSETS,
                   "Within each replica every batch starts right after the previous one "
                   "(no gap, no overlap, strictly increasing), across segments too; in a "
                   "compacted partition offsets may skip forward.",
                   derived.framed_batches, v,
                   violation_count=(None if compacted else
                                    derived.offset_order_breaks + len(boundary)))


def epochs_monotonic(inputs: AuditInputs, derived: Derived) -> RuleResult:
    v = _reader_violations(inputs, derived, RULE_EPOCHS, derived.epoch_drops)
    boundary = [(broker, topic, partition, nxt.first_base_offset,
                 f"{epoch_drop_problem(nxt.first_epoch, prev.last_epoch)} (segment boundary)")
                for broker, topic, partition, prev, nxt in derived.segment_boundaries()
                if nxt.first_epoch < prev.last_epoch]
    if boundary:
        v = v.unionByName(_local_violations(inputs.spark, RULE_EPOCHS, boundary))
    return _result("epochs_monotonic",
                   "Within each replica the batches' partitionLeaderEpoch never decreases.",
                   derived.framed_batches, v, violation_count=derived.epoch_drops + len(boundary))


def epoch_checkpoint_matches_log(inputs: AuditInputs, derived: Derived) -> RuleResult:
    logs = derived.replica_epoch_logs()
    files: dict[tuple[int, str, int], list] = defaultdict(list)
    errors: dict[tuple[int, str, int], str] = {}
    for r in derived.checkpoint_rows:
        if r.kind != "leader-epoch":
            continue
        key = (r.broker_id, r.topic, r.partition)
        if r.error is not None:
            errors[key] = r.error
        else:
            files[key].append((r.entry_index, r.epoch, r.offset))
    rows = []
    keys = sorted(set(logs) | set(files) | set(errors), key=str)
    for key in keys:
        broker, topic, partition = key
        if key in errors:
            rows.append((broker, topic, partition, None, f"unreadable: {errors[key]}"))
            continue
        expected = logs.get(key, {}).get("cache", [])
        log_end = logs.get(key, {}).get("log_end_offset")
        actual = [(e, o) for _i, e, o in sorted(files.get(key, []))]
        compare = (compare_epoch_checkpoint(expected, actual, log_end)
                   if (topic, partition) not in inputs.compacted
                   else compare_compacted_epoch_checkpoint(expected, actual))
        for problem, offset in compare:
            rows.append((broker, topic, partition, offset, problem))
    v = _driver_violations(derived, "epoch_checkpoint_matches_log", rows)
    return _result("epoch_checkpoint_matches_log",
                   "Each replica's leader-epoch-checkpoint equals the epoch cache its own log "
                   "implies (first batch of each epoch).", len(keys), v)


def offset_checkpoints_within_log(inputs: AuditInputs, derived: Derived) -> RuleResult:
    logs = {(r.broker_id, r.topic, r.partition): r for r in derived.replica_rows}
    per_replica: dict[tuple[int, str, int], dict[str, int]] = defaultdict(dict)
    rows = []
    for r in derived.checkpoint_rows:
        if r.kind == "leader-epoch":
            continue
        if r.error is not None:
            rows.append((r.broker_id, None, None, None, f"unreadable: {r.error}"))
        else:
            per_replica[(r.broker_id, r.topic, r.partition)][r.kind] = r.offset
    for key, kinds in sorted(per_replica.items(), key=str):
        broker, topic, partition = key
        log = logs.get(key)
        log_end = log.log_end_offset if log else 0
        first = log.log_start_offset if log else None
        hw, rp, start = (kinds.get("high-watermark"), kinds.get("recovery-point"),
                         kinds.get("log-start-offset"))
        if hw is not None and hw > log_end:
            rows.append((broker, topic, partition, hw,
                         f"HW checkpoint {hw} above the log end {log_end}"))
        if rp is not None and rp > log_end:
            rows.append((broker, topic, partition, rp,
                         f"recovery point {rp} above the log end {log_end}"))
        if start is not None and hw is not None and start > hw:
            rows.append((broker, topic, partition, start,
                         f"log start offset {start} above the HW {hw}"))
        if (start is not None and first is not None and start < first
                and (topic, partition) not in inputs.compacted):  # the cleaner removed it
            rows.append((broker, topic, partition, start,
                         f"log start offset {start} below the first batch {first}"))
    v = _driver_violations(derived, "offset_checkpoints_within_log", rows)
    return _result("offset_checkpoints_within_log",
                   "Offset checkpoints fit the log: log start <= HW <= log end, "
                   "recovery point <= log end.", len(per_replica), v)


def replicas_agree_below_hw(inputs: AuditInputs, derived: Derived) -> RuleResult:
    spark = inputs.spark
    hw = derived.committed_high_watermarks()
    hw_df = spark.createDataFrame([(t, p, i, o) for (t, p, i), o in hw.items()],
                                  "topic string, partition int, topic_id string, "
                                  "high_watermark long")
    replica_counts: dict[tuple[str, int, str], int] = defaultdict(int)
    for r in derived.replica_rows:
        replica_counts[r.incarnation] += 1
    counts_df = spark.createDataFrame([(t, p, i, n) for (t, p, i), n in replica_counts.items()],
                                      "topic string, partition int, topic_id string, "
                                      "replicas int")
    holders = _batch_holders(inputs, derived, hw_df)
    # A batch every replica of its partition holds is missing from none: the
    # common case, dropped before pairing holders with peers.
    mine = (holders.join(F.broadcast(counts_df), INCARNATION_KEYS)
            .where(F.size(F.array_distinct("holders")) < F.col("replicas"))
            .select("*", F.explode("holders").alias("broker_id")))
    peers = derived.replicas.select(
        F.col("broker_id").alias("peer_id"), *INCARNATION_KEYS,
        F.col("log_start_offset").alias("peer_start"), F.col("log_end_offset").alias("peer_end"))
    # Every (copy, peer) where the peer's log covers the batch's offsets below the
    # HW and the peer holds no identical batch.
    bad = (mine.join(F.broadcast(peers), INCARNATION_KEYS)
           .where((F.col("peer_id") != F.col("broker_id"))
                  & (F.col("peer_start") <= F.col("base_offset"))
                  & (F.col("last_offset") < F.col("peer_end"))
                  & ~F.array_contains("holders", F.col("peer_id"))))
    detail = F.format_string(
        "broker %d holds batch %d..%d (epoch %d, crc %d) below HW %d; broker %d does not",
        F.col("broker_id"), F.col("base_offset"), F.col("last_offset"),
        F.col("partition_leader_epoch"), F.col("crc_stored"), F.col("high_watermark"),
        F.col("peer_id"))
    v = _violations(bad, "replicas_agree_below_hw", F.col("peer_id"), F.col("topic"),
                    F.col("partition"), F.col("base_offset"), detail)
    if inputs.compacted and inputs.records is not None:
        v = v.unionByName(compacted_replicas_disagree(inputs, hw_df))
    info = replica_positions(derived, hw)
    return _result("replicas_agree_below_hw",
                   "Below the committed HW of a partition (one topic incarnation) every "
                   "replica of it that covers an offset "
                   "holds the identical batch (offsets, epoch, CRC).",
                   derived.framed_batches, v, info=info)


def _batch_holders(inputs: AuditInputs, derived: Derived, hw_df: DataFrame) -> DataFrame:
    """Each distinct batch below the HW (INCARNATION_KEYS, base_offset, last_offset,
    partition_leader_epoch, crc_stored, high_watermark) with the brokers holding it
    (``holders``, one entry per copy), at least those not every replica holds.

    Keyed by incarnation: another incarnation of the name is another partition.
    Incarnations whose logs hold their batches in base-offset order (nearly always)
    are merged replica by replica in the reader (tidewater-log level disagreement),
    which drops the batches every replica holds identically: no batch row reaches
    Spark. The others group every batch row in Spark (a shuffle of every batch).
    """
    columns = [*INCARNATION_KEYS, "base_offset", "last_offset", "partition_leader_epoch",
               "crc_stored"]
    present = {(r.topic, r.partition, r.topic_id or "") for r in derived.segment_rows
               if (r.topic, r.partition) not in inputs.compacted}  # compared per record
    merged = derived.ordered_incarnations() & present if inputs.disagreements else set()
    grouped = present - merged
    parts = []
    if merged:
        parts.append(inputs.disagreements(sorted(merged))
                     .join(F.broadcast(hw_df), INCARNATION_KEYS)
                     .where(F.col("last_offset") < F.col("high_watermark")))
    if grouped or not parts:
        wanted = inputs.spark.createDataFrame(sorted(grouped), "topic string, partition int, "
                                              "topic_id string")
        framed = derived.framed.fillna("", ["topic_id"])
        # One pass over the batches, no join of the batches with themselves.
        parts.append(framed.join(F.broadcast(wanted), INCARNATION_KEYS)
                     .join(F.broadcast(hw_df), INCARNATION_KEYS)
                     .where(F.col("last_offset") < F.col("high_watermark"))
                     .groupBy(*columns, "high_watermark")
                     .agg(F.collect_list("broker_id").alias("holders")))
    return _union([p.select(*columns, "high_watermark", "holders") for p in parts])


def compacted_replicas_disagree(inputs: AuditInputs, hw_df: DataFrame) -> DataFrame:
    """Below the HW of a compacted partition, replicas holding the same offset hold the
    same key and value there (each may have removed other old records)."""
    assert inputs.records is not None
    records = (inputs.records.where(_compacted(inputs) & F.col("crc_valid")
                                    & F.col("error").isNull())
               .fillna("", ["topic_id"])
               .join(F.broadcast(hw_df), INCARNATION_KEYS)
               .where(F.col("offset") < F.col("high_watermark")))
    copies = (records.groupBy(*INCARNATION_KEYS, "offset")
              .agg(F.collect_set(F.struct("key", "value")).alias("records"),
                   F.min("broker_id").alias("broker_id"))
              .where(F.size("records") > 1))
    detail = F.format_string("replicas of a compacted partition hold %d different records "
                             "at offset %d", F.size("records"), F.col("offset"))
    return _violations(copies, "replicas_agree_below_hw", F.col("broker_id"), F.col("topic"),
                       F.col("partition"), F.col("offset"), detail)


def replica_positions(derived: Derived, hw: dict[tuple[str, int, str], int]) -> dict:
    """Lagging replicas and uncommitted suffixes, for the report (never violations)."""
    lagging, uncommitted = [], []
    for r in sorted(derived.replica_rows, key=lambda r: (r.topic, r.partition, r.broker_id)):
        committed = hw.get(r.incarnation)
        if committed is None:
            continue
        where = {"broker_id": r.broker_id, "topic": r.topic, "partition": r.partition,
                 "topic_id": r.topic_id, "log_end_offset": r.log_end_offset,
                 "high_watermark": committed}
        if r.log_end_offset < committed:
            lagging.append(where)
        elif r.log_end_offset > committed:
            uncommitted.append({**where, "uncommitted_offsets": r.log_end_offset - committed})
    per_name: dict[tuple[str, int], int] = defaultdict(int)
    for t, p, _i in hw:
        per_name[(t, p)] += 1

    def name(t: str, p: int, i: str) -> str:  # the incarnation only when the name has several
        return f"{t}-{p}" if per_name[(t, p)] == 1 else f"{t}-{p}@{i or 'no-id'}"

    return {"high_watermarks": {name(t, p, i): o for (t, p, i), o in sorted(hw.items())},
            "lagging_replicas": lagging, "uncommitted_suffixes": uncommitted}


def epoch_histories_agree(inputs: AuditInputs, derived: Derived) -> RuleResult:
    logs = derived.replica_epoch_logs()
    by_incarnation: dict[tuple[str, int, str], list] = defaultdict(list)
    for (broker, topic, partition), log in logs.items():
        if (topic, partition) in inputs.compacted:
            continue  # compaction removes first batches of epochs: records compared instead
        topic_id = derived.topic_ids.get((broker, topic, partition), "")
        by_incarnation[(topic, partition, topic_id)].append((broker, log))
    rows, pairs = [], 0
    for (topic, partition, _topic_id), replicas in sorted(by_incarnation.items()):
        replicas.sort(key=lambda item: item[0])
        for i, (a, log_a) in enumerate(replicas):
            for b, log_b in replicas[i + 1:]:
                pairs += 1
                for epoch, start_a, start_b in diverging_epochs(log_a, log_b):
                    rows.append((b, topic, partition, min(start_a, start_b),
                                 f"epoch {epoch} starts at {start_a} on broker {a}, "
                                 f"at {start_b} on broker {b}"))
    v = _driver_violations(derived, "epoch_histories_agree", rows)
    return _result("epoch_histories_agree",
                   "The replicas' leader-epoch histories (from their logs) agree on every "
                   "epoch they share (replicas of one topic incarnation).", pairs, v)


# ---------------------------------------------------------------- metrics rules


def replica_samples(metrics: DataFrame | None) -> DataFrame | None:
    """One row per (timestamp, broker, topic, partition) with the replica gauges as columns."""
    if metrics is None:
        return None
    name = F.col("name")
    short = F.lit(None).cast("string")
    for prefix in reversed(BROKER_METRIC_PREFIXES):
        short = F.when(name.startswith(prefix), F.expr(f"substring(name, {len(prefix) + 1})")
                       ).otherwise(short)
    m = (metrics.withColumn("gauge", short)
         .where(F.col("gauge").isin(*REPLICA_GAUGES))
         .where(F.col("labels").getItem("topic").isNotNull()
                & F.col("labels").getItem("partition").isNotNull())
         .select("timestamp_ms",
                 F.coalesce(F.col("labels").getItem("broker").cast("int"),
                            F.regexp_extract("source", r"broker[-_]?(\d+)", 1).cast("int"))
                 .alias("broker_id"),
                 F.col("labels").getItem("topic").alias("topic"),
                 F.col("labels").getItem("partition").cast("int").alias("partition"),
                 "gauge", "value"))
    return (m.groupBy("timestamp_ms", *REPLICA_KEYS).pivot("gauge", list(REPLICA_GAUGES))
            .agg(F.max("value")))


def _skipped(derived: Derived, name: str, description: str, why: str) -> RuleResult:
    return RuleResult(name, description, 0, derived.no_violations,
                      violation_count=0, skipped=why)


def hw_monotonic_per_leader_epoch(inputs: AuditInputs, derived: Derived) -> RuleResult:
    name = "hw_monotonic_per_leader_epoch"
    description = "A leader's HW never goes backwards within one leader epoch (metrics)."
    if derived.samples is None:
        return _skipped(derived, name, description, "no metrics given")
    leaders = derived.samples.where((F.col("is_leader") == 1)
                                    & F.col("high_watermark").isNotNull())
    w = Window.partitionBy(*REPLICA_KEYS, "leader_epoch").orderBy("timestamp_ms")
    o = leaders.withColumn("prev_hw", F.lag("high_watermark").over(w))
    bad = o.where(F.col("high_watermark") < F.col("prev_hw"))
    detail = F.format_string("leader HW %d after %d in leader epoch %d at %d ms",
                             F.col("high_watermark").cast("long"), F.col("prev_hw").cast("long"),
                             F.col("leader_epoch").cast("long"), F.col("timestamp_ms"))
    v = _violations(bad, name, F.col("broker_id"), F.col("topic"), F.col("partition"),
                    F.col("high_watermark"), detail)
    checked = sum(1 for r in derived.sample_rows
                  if r.is_leader == 1 and r.high_watermark is not None)
    return _result(name, description, checked, v)


def hw_not_above_leo(inputs: AuditInputs, derived: Derived) -> RuleResult:
    name = "hw_not_above_leo"
    description = "In every sample a replica's HW is at most its log end offset (metrics)."
    if derived.samples is None:
        return _skipped(derived, name, description, "no metrics given")
    bad = derived.samples.where(F.col("high_watermark") > F.col("log_end_offset"))
    detail = F.format_string("HW %d above LEO %d at %d ms", F.col("high_watermark").cast("long"),
                             F.col("log_end_offset").cast("long"), F.col("timestamp_ms"))
    v = _violations(bad, name, F.col("broker_id"), F.col("topic"), F.col("partition"),
                    F.col("high_watermark"), detail)
    checked = sum(1 for r in derived.sample_rows
                  if r.high_watermark is not None and r.log_end_offset is not None)
    return _result(name, description, checked, v)


# ---------------------------------------------------------------- ack rule


def acked_writes_present(inputs: AuditInputs, derived: Derived) -> RuleResult:
    name = "acked_writes_present"
    description = ("Every record acknowledged with acks=all is held by a replica at its "
                   "acknowledged offset with the same key and value (acks=1 losses counted "
                   "apart, as expected behaviour).")
    if inputs.acks is None or inputs.records is None:
        return _skipped(derived, name, description, "no ack log given")
    acks = inputs.acks.where(F.col("acks").isin("all", "1") & (F.col("offset") >= 0))
    held = (inputs.records.where(F.col("crc_valid") & F.col("error").isNull())
            .select(*PARTITION_KEYS, "offset", F.col("key").alias("held_key"),
                    F.col("value").alias("held_value"), "broker_id"))
    matched = (acks.join(held, PARTITION_KEYS + ["offset"], "left")
               .withColumn("same", F.col("held_key").eqNullSafe(F.col("key"))
                           & F.col("held_value").eqNullSafe(F.col("value")))
               .groupBy("ack_id", *PARTITION_KEYS, "offset", "acks")
               .agg(F.max(F.col("same").cast("int")).alias("present"),
                    F.count("broker_id").alias("replicas_with_offset"))
               .withColumn("lost", F.coalesce(F.col("present"), F.lit(0)) == 0))
    if inputs.compacted:
        # The cleaner removes a key's older records and its old tombstones: only the
        # latest acknowledged value of a key must still be there.
        newest = Window.partitionBy(*PARTITION_KEYS, "key").orderBy(F.col("offset").desc())
        latest = (acks.select("ack_id", F.row_number().over(newest).alias("rank"),
                              F.col("value").isNull().alias("tombstone")))
        matched = (matched.join(latest, "ack_id")
                   .withColumn("lost", F.col("lost") & ~(
                       _compacted(inputs) & (F.col("replicas_with_offset") == 0)
                       & ((F.col("rank") > 1) | F.col("tombstone"))))
                   .drop("rank", "tombstone"))
    # One job: every ack outcome comes to the driver only as counts, and the lost
    # ones (few, unless something is badly wrong) as rows.
    matched = matched.cache()
    counts = {r.acks: (r.total, r.lost or 0) for r in matched.groupBy("acks").agg(
        F.count("*").alias("total"), F.sum(F.col("lost").cast("int")).alias("lost")).collect()}
    detail = F.when(F.col("replicas_with_offset") == 0,
                    F.format_string("acks=%s record at offset %d: no replica holds the offset",
                                    F.col("acks"), F.col("offset"))
                    ).otherwise(F.format_string(
                        "acks=%s record at offset %d: %d replica(s) hold a different record",
                        F.col("acks"), F.col("offset"), F.col("replicas_with_offset")))
    v = _violations(matched.where(F.col("lost") & (F.col("acks") == "all")), name, F.lit(None),
                    F.col("topic"), F.col("partition"), F.col("offset"), detail)
    info = {"acks_all_checked": counts.get("all", (0, 0))[0],
            "acks_all_lost": counts.get("all", (0, 0))[1],
            "acks_1_checked": counts.get("1", (0, 0))[0],
            "acks_1_lost": counts.get("1", (0, 0))[1]}
    return _result(name, description, info["acks_all_checked"], v, info=info)


SEQUENCE_MAX = 2**31 - 1  # sequences wrap to 0 after it (Kafka's DefaultRecordBatch)


def producer_sequences_contiguous(inputs: AuditInputs, derived: Derived) -> RuleResult:
    """Idempotent producers (issue 17): per replica, producer id and epoch, each batch's
    first sequence follows the previous batch's last one (a repeat is a duplicate write,
    a gap a lost one). The first batch a replica holds of an epoch may start anywhere
    (retention deletes from the front)."""
    name = "producer_sequences_contiguous"
    description = ("Within each producer id and epoch, the sequences in a replica are "
                   "contiguous and never repeated (idempotent producers).")
    if not derived.idempotent_batches:  # counted by the reader: no batch to order
        return _result(name, description, 0, derived.no_violations, violation_count=0)
    batches = inputs.batches.where(
        (F.col("producer_id") >= 0) & (F.col("base_sequence") >= 0)
        & F.col("status").isin(*FRAMED_STATUSES))
    order = Window.partitionBy(*REPLICA_KEYS, "topic_id", "producer_id",
                               "producer_epoch").orderBy("base_offset")
    last_sequence = F.col("base_sequence") + (F.col("last_offset") - F.col("base_offset"))
    last_sequence = F.when(last_sequence > SEQUENCE_MAX,
                           last_sequence - SEQUENCE_MAX - 1).otherwise(last_sequence)
    previous = F.lag(last_sequence).over(order)
    expected = F.when(previous == SEQUENCE_MAX, F.lit(0)).otherwise(previous + 1)
    checked = batches.withColumn("previous", previous).withColumn("expected", expected)
    broken = checked.where(F.col("previous").isNotNull()
                           & (F.col("base_sequence") != F.col("expected")))
    detail = F.concat(F.lit("producer "), F.col("producer_id").cast("string"), F.lit(" epoch "),
                      F.col("producer_epoch").cast("string"), F.lit(": sequence "),
                      F.col("base_sequence").cast("string"),
                      F.when(F.col("base_sequence") <= F.col("previous"),
                             F.lit(" repeats, after ")).otherwise(F.lit(" skips, after ")),
                      F.col("previous").cast("string"))
    v = _violations(broken, name, F.col("broker_id"), F.col("topic"), F.col("partition"),
                    F.col("base_offset"), detail)
    return _result(name, description, derived.idempotent_batches, v)


OPEN_TRANSACTIONS_LISTED_MAX = 20


def transactions_end_with_markers(inputs: AuditInputs, derived: Derived) -> RuleResult:
    name = "transactions_end_with_markers"
    description = ("Every transaction (producer id, epoch) ends with a COMMIT or ABORT marker "
                   "in every replica it wrote to; one still open at the log end is reported, "
                   "not failed.")
    rows, checked, committed, aborted, open_ = [], 0, 0, 0, []
    for (broker, topic, partition, _tid), replica in sorted(derived.transactional.items()):
        t = replica.replayed
        committed += t.committed
        aborted += len(t.aborted)
        checked += t.committed + len(t.aborted) + len(t.open) + len(t.violations)
        open_ += [f"{topic}-{partition} broker {broker}: producer {o.producer_id} epoch "
                  f"{o.producer_epoch} from offset {o.first_offset}" for o in t.open]
        rows += [(broker, topic, partition, offset, detail)
                 for offset, detail in replica.key_errors + t.violations]
    info = {"committed": committed, "aborted": aborted, "open": len(open_),
            "open_examples": open_[:OPEN_TRANSACTIONS_LISTED_MAX]}
    return _result(name, description, checked, _driver_violations(derived, name, rows),
                   violation_count=len(rows), info=info)


def transaction_markers_agree(inputs: AuditInputs, derived: Derived) -> RuleResult:
    name = "transaction_markers_agree"
    description = ("Replicas of a partition (one topic incarnation) hold the same COMMIT and "
                   "ABORT markers (offset, producer, type) below the committed HW.")
    hw = derived.committed_high_watermarks()
    spans = {(r.broker_id, r.topic, r.partition, r.topic_id): (r.log_start_offset,
                                                               r.log_end_offset + 1)
             for r in derived.replica_rows}
    by_incarnation: dict[tuple[str, int, str], dict] = defaultdict(dict)
    for (broker, topic, partition, tid), replica in derived.transactional.items():
        if not replica.replayed.markers:
            continue
        start, end = spans.get((broker, topic, partition, tid), (0, 0))
        # Above the committed HW a replica may still hold what truncation will cut.
        end = min(end, hw.get((topic, partition, tid), end))
        by_incarnation[(topic, partition, tid)][broker] = (start, end, replica.replayed.markers)
    # A replica holding no marker at all is compared too: it must hold none in the span.
    for (broker, topic, partition, tid), (start, end) in spans.items():
        replicas = by_incarnation.get((topic, partition, tid))
        if replicas is not None and broker not in replicas:
            replicas[broker] = (start, min(end, hw.get((topic, partition, tid), end)), {})
    rows, pairs = [], 0
    for (topic, partition, _tid), replicas in sorted(by_incarnation.items()):
        pairs += len(replicas) - 1
        rows += [(broker, topic, partition, offset, detail)
                 for broker, offset, detail in markers_disagree(replicas)]
    return _result(name, description, pairs, _driver_violations(derived, name, rows),
                   violation_count=len(rows))


def read_committed_excludes_aborted(inputs: AuditInputs, derived: Derived) -> RuleResult:
    name = "read_committed_excludes_aborted"
    description = ("A read_committed view of each replica (control batches and its "
                   ".txnindex's aborted ranges skipped) holds no batch of a transaction "
                   "its ABORT markers abort.")
    rows, checked = [], 0
    for (broker, topic, partition, _tid), replica in sorted(derived.transactional.items()):
        checked += len(replica.replayed.aborted)
        rows += [(broker, topic, partition, offset, detail) for offset, detail
                 in read_committed_leaks(replica.batches, replica.replayed.aborted,
                                         replica.index)]
    return _result(name, description, checked, _driver_violations(derived, name, rows),
                   violation_count=len(rows))


RULES: tuple[Callable[[AuditInputs, Derived], RuleResult], ...] = (
    batch_crc_and_framing,
    offsets_contiguous,
    epochs_monotonic,
    epoch_checkpoint_matches_log,
    offset_checkpoints_within_log,
    replicas_agree_below_hw,
    epoch_histories_agree,
    hw_monotonic_per_leader_epoch,
    hw_not_above_leo,
    acked_writes_present,
    producer_sequences_contiguous,
    transactions_end_with_markers,
    transaction_markers_agree,
    read_committed_excludes_aborted,
)
BATCH_LEVEL_RULES = (batch_crc_and_framing, offsets_contiguous, epochs_monotonic)


@dataclass
class AuditResults:
    rules: list[RuleResult]
    violations: DataFrame      # every rule's violations, cached
    derived: Derived


def run_rules(inputs: AuditInputs, rules=RULES) -> AuditResults:
    """Run ``rules``; the violations not counted on the way are counted in one job.

    ``violations`` holds only the rules that have some (a failing rule's rows
    come from the counting job's cache, or are computed again when the report
    reads them).
    """
    derived = Derived(inputs)
    results = [rule(inputs, derived) for rule in rules]
    uncounted = [r for r in results if r.violation_count is None]
    union = None
    if uncounted:
        union = _union([r.violations for r in uncounted]).cache()
        counts = {r.rule: r["count"] for r in union.groupBy("rule").count().collect()}
        for r in uncounted:
            r.violation_count = counts.get(r.name, 0)
    # The rules counted in that job have their rows in its cache: read them there.
    counted_here = {r.name for r in uncounted}
    failing = [r.violations for r in results
               if r.violation_count and r.name not in counted_here]
    failing_counted = [r.name for r in uncounted if r.violation_count]
    if failing_counted:
        failing.append(union.where(F.col("rule").isin(*failing_counted)))
    violations = (_union(failing).cache() if failing
                  else derived.no_violations)
    return AuditResults(results, violations, derived)


def _union(frames: list[DataFrame]) -> DataFrame:
    union = frames[0]
    for frame in frames[1:]:
        union = union.unionByName(frame)
    return union
