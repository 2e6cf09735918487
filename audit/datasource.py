"""PySpark 4 Python data sources over Tidewater's files: log, checkpoints, metrics.

    spark.read.format("tidewater-log").load("data/")            one row per batch
    spark.read.format("tidewater-log").option("level", "record").load(...)
    spark.read.format("tidewater-log").option("level", "segment").load(...)  one per segment
    spark.read.format("tidewater-checkpoints").load("data/")
    spark.read.format("tidewater-metrics").load("metrics/")

``load`` takes one path; several go in the ``paths`` option as a JSON list.
A path may be a folder of broker folders, a data dir, a partition dir or one
segment file (see reader.py). One input partition per segment file (log; the
``max_partitions`` option groups them into at most that many, of about equal
bytes: fewer, longer tasks when the per-task cost matters), per data dir
(checkpoints), per metrics file (metrics), so reading scales out.

Options of ``tidewater-log``: ``level`` = ``batch`` (default), ``record``,
``segment`` (one summary row per segment file: counts, first and last whole
batch, and the batch-level rules' violations and epoch changes, decided by the
reader in Python, so Spark handles a few rows per segment, not one per batch) or
``disagreement`` (one row per batch that not every replica of its topic
incarnation holds identically, with the brokers holding it: the replicas of an
incarnation are read side by side in one task and merged by base offset,
reader.replica_disagreements; ``incarnations`` = a JSON list of ``[topic,
partition, topic_id]`` to compare, each of whose logs must have strictly
increasing base offsets, default all);
``payload`` (record level) = ``bytes`` (default: key and value columns),
``hash`` (only their blake2b-128 hex digests) or ``both``;
``topic_partitions`` = a JSON list of ``[topic, partition]`` to read only those;
``columns`` (batch level) = comma-separated batch columns to produce, in that
order (the API has no column pruning: this is how a reader of a few columns
avoids building the rest).

The log source yields Arrow record batches (the reader builds columns in
chunks), which keeps the Python-to-JVM hop cheap on large dumps.
"""

from __future__ import annotations

import heapq
import json
from collections.abc import Iterator
from operator import itemgetter

from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition

from tidewater.audit import metrics_reader, reader

# topic_id: the replica's incarnation (partition.metadata), "" for one written before topic IDs.
_COMMON_LOG_COLUMNS = (
    ("broker_id", "int"), ("data_dir", "string"), ("topic", "string"), ("partition", "int"),
    ("segment", "string"), ("segment_base_offset", "long"), ("topic_id", "string"),
)
BATCH_COLUMNS = _COMMON_LOG_COLUMNS + (
    ("position", "long"), ("base_offset", "long"), ("last_offset", "long"),
    ("record_count", "int"), ("partition_leader_epoch", "int"), ("magic", "int"),
    ("attributes", "int"), ("crc_stored", "long"), ("crc_valid", "boolean"),
    ("base_timestamp", "long"), ("max_timestamp", "long"), ("producer_id", "long"),
    ("size_bytes", "long"), ("status", "string"), ("error", "string"),
    ("prev_last_offset", "long"), ("prev_epoch", "int"),
    ("producer_epoch", "int"), ("base_sequence", "int"),
)
assert tuple(c for c, _ in BATCH_COLUMNS[len(_COMMON_LOG_COLUMNS):]) == reader.BATCH_FIELDS
RECORD_COLUMNS = _COMMON_LOG_COLUMNS + (
    ("batch_position", "long"), ("batch_base_offset", "long"), ("batch_epoch", "int"),
    ("crc_valid", "boolean"), ("offset", "long"), ("timestamp", "long"),
    ("key", "binary"), ("value", "binary"), ("key_hash", "string"), ("value_hash", "string"),
    ("error", "string"),
)
SEGMENT_COLUMNS = _COMMON_LOG_COLUMNS + (
    ("batch_count", "long"), ("row_count", "long"), ("first_base_offset", "long"),
    ("first_epoch", "int"), ("last_offset", "long"), ("last_epoch", "int"),
    ("log_start_offset", "long"), ("log_end_offset", "long"), ("bad_batches", "long"),
    ("offset_order_breaks", "long"), ("epoch_drops", "long"),
    ("violations", "array<struct<rule: string, offset: long, detail: string>>"),
    ("epoch_changes",
     "array<struct<position: long, partition_leader_epoch: int, base_offset: long>>"),
    ("last_base_offset", "long"), ("base_order_breaks", "long"), ("idempotent_batches", "long"),
)
assert tuple(c for c, _ in SEGMENT_COLUMNS[len(_COMMON_LOG_COLUMNS):]) == reader.SEGMENT_FIELDS
# topic_id: that of the partition dir the entry is about in the same data dir ("" if none).
DISAGREEMENT_COLUMNS = (
    ("topic", "string"), ("partition", "int"), ("topic_id", "string"),
    ("base_offset", "long"), ("last_offset", "long"), ("partition_leader_epoch", "int"),
    ("crc_stored", "long"), ("holders", "array<int>"),
)
CHECKPOINT_COLUMNS = (
    ("broker_id", "int"), ("data_dir", "string"), ("file", "string"), ("kind", "string"),
    ("topic", "string"), ("partition", "int"), ("entry_index", "int"), ("epoch", "int"),
    ("offset", "long"), ("error", "string"), ("topic_id", "string"),
)
METRIC_COLUMNS = (
    ("timestamp_ms", "long"), ("source", "string"), ("name", "string"),
    ("labels", "map<string,string>"), ("value", "double"),
)

CHECKPOINT_KIND_LEADER_EPOCH = "leader-epoch"


def ddl(columns) -> str:
    return ", ".join(f"`{name}` {kind}" for name, kind in columns)


def _arrow_type(kind: str):
    import pyarrow as pa

    return {"int": pa.int32(), "long": pa.int64(), "string": pa.string(),
            "boolean": pa.bool_(), "binary": pa.binary(), "double": pa.float64()}[kind]


def input_paths(options) -> list[str]:
    """The paths given to load(): ``path``, or ``paths`` as a JSON list."""
    paths: list[str] = []
    raw = options.get("paths")
    if raw:
        parsed = json.loads(raw) if raw.lstrip().startswith("[") else [raw]
        paths.extend(str(p) for p in parsed)
    if options.get("path"):
        paths.append(options["path"])
    if not paths:
        raise reader.AuditInputError("no path: use .load(PATH) or .option('paths', '[...]')")
    return paths


# ---------------------------------------------------------------- tidewater-log


LOG_LEVELS = ("batch", "record", "segment", "disagreement")


class TidewaterLogDataSource(DataSource):
    @classmethod
    def name(cls) -> str:
        return "tidewater-log"

    def _level(self) -> str:
        level = self.options.get("level", "batch").lower()
        if level not in LOG_LEVELS:
            raise ValueError(f"tidewater-log: level must be one of {', '.join(LOG_LEVELS)}, "
                             f"not {level!r}")
        return level

    def _batch_columns(self) -> tuple:
        """BATCH_COLUMNS, or the subset named by the ``columns`` option (in that order)."""
        raw = self.options.get("columns")
        if not raw:
            return BATCH_COLUMNS
        kinds = dict(BATCH_COLUMNS)
        names = [c.strip() for c in raw.split(",") if c.strip()]
        unknown = [c for c in names if c not in kinds]
        if unknown or not names:
            raise ValueError(f"tidewater-log: unknown columns {unknown}; known: {list(kinds)}")
        return tuple((c, kinds[c]) for c in names)

    def schema(self) -> str:
        level = self._level()
        if level == "segment":
            return ddl(SEGMENT_COLUMNS)
        if level == "disagreement":
            return ddl(DISAGREEMENT_COLUMNS)
        return ddl(self._batch_columns() if level == "batch" else RECORD_COLUMNS)

    def reader(self, schema) -> DataSourceReader:
        payload = self.options.get("payload", "bytes").lower()
        if payload not in ("bytes", "hash", "both"):
            raise ValueError(f"tidewater-log: payload must be bytes, hash or both, not {payload!r}")
        wanted = None
        if self.options.get("topic_partitions"):
            wanted = {(str(t), int(p)) for t, p in json.loads(self.options["topic_partitions"])}
        max_partitions = None
        if self.options.get("max_partitions"):
            max_partitions = int(self.options["max_partitions"])
            if max_partitions < 1:
                raise ValueError("tidewater-log: max_partitions must be at least 1")
        if self._level() == "disagreement":
            incarnations = None
            if self.options.get("incarnations"):
                incarnations = {(str(t), int(p), str(i))
                                for t, p, i in json.loads(self.options["incarnations"])}
            return _DisagreementReader(input_paths(self.options), incarnations, max_partitions)
        return _LogReader(input_paths(self.options), self._level(), payload, wanted,
                          [c for c, _ in self._batch_columns()], max_partitions)


class _SegmentPartition(InputPartition):
    def __init__(self, segments: list[reader.SegmentFile]):
        super().__init__([s.path for s in segments])
        self.segments = segments


def group_segments(segments: list[reader.SegmentFile],
                   max_partitions: int | None) -> list[list[reader.SegmentFile]]:
    """Segments in at most ``max_partitions`` groups of about equal bytes (None: one each).

    Largest files first, each to the group with the fewest bytes so far, so the
    long tasks start early and the groups end together.
    """
    ordered = sorted(segments, key=lambda s: -s.size_bytes)
    if not max_partitions or max_partitions >= len(ordered):
        return [[s] for s in ordered]
    groups: list[tuple[int, int, list]] = [(0, i, []) for i in range(max_partitions)]
    for segment in ordered:
        size, i, members = heapq.heappop(groups)
        members.append(segment)
        heapq.heappush(groups, (size + segment.size_bytes, i, members))
    return [members for _size, _i, members in sorted(groups, key=lambda g: (-g[0], g[1]))]


class _LogReader(DataSourceReader):
    def __init__(self, paths: list[str], level: str, payload: str,
                 wanted: set[tuple[str, int]] | None, columns: list[str],
                 max_partitions: int | None = None):
        self.paths = paths
        self.max_partitions = max_partitions
        self.level = level
        self.payload = payload
        self.wanted = wanted
        self.columns = columns

    def partitions(self):
        inventory = reader.discover(self.paths)
        segments = [s for s in inventory.segments
                    if self.wanted is None or (s.topic, s.partition) in self.wanted]
        return ([_SegmentPartition(g) for g in group_segments(segments, self.max_partitions)]
                or [InputPartition(None)])

    def read(self, partition) -> Iterator:
        for segment in getattr(partition, "segments", ()):
            if self.level == "batch":
                yield from _batch_arrow(segment, self.columns)
            elif self.level == "segment":
                summary = reader.summarize_segment_file(segment)
                if summary is not None:  # an empty file has no batch to summarize
                    yield (segment.broker_id, segment.data_dir, segment.topic,
                           segment.partition, segment.path, segment.base_offset,
                           segment.topic_id, *summary)
            else:
                yield from _record_arrow(segment, self.payload)


class _IncarnationsPartition(InputPartition):
    """Every replica log of some topic incarnations: (topic, partition, topic_id, logs),
    each log (broker id, its segment paths in base-offset order)."""

    def __init__(self, incarnations: list[tuple[str, int, str, list[tuple[int, list[str]]]]]):
        super().__init__([i[:3] for i in incarnations])
        self.incarnations = incarnations


def replica_logs(segments: list[reader.SegmentFile]) -> dict[tuple[str, int, str], dict]:
    """Per incarnation: {(broker, data dir): its segments in base-offset order}."""
    logs: dict[tuple[str, int, str], dict] = {}
    for s in sorted(segments, key=lambda s: (s.base_offset, s.path)):
        logs.setdefault((s.topic, s.partition, s.topic_id), {}).setdefault(
            (s.broker_id, s.data_dir), []).append(s)
    return logs


class _DisagreementReader(DataSourceReader):
    def __init__(self, paths: list[str], incarnations: set[tuple[str, int, str]] | None,
                 max_partitions: int | None):
        self.paths = paths
        self.incarnations = incarnations
        self.max_partitions = max_partitions

    def partitions(self):
        logs = replica_logs(reader.discover(self.paths).segments)
        wanted = [(key, replicas) for key, replicas in sorted(logs.items())
                  if self.incarnations is None or key in self.incarnations]
        # All replicas of an incarnation in one task (merged there); incarnations grouped
        # into at most max_partitions tasks of about equal bytes, as group_segments does.
        sizes = {key: sum(s.size_bytes for segs in replicas.values() for s in segs)
                 for key, replicas in wanted}
        groups: list[tuple[int, int, list]] = [(0, i, []) for i in range(
            min(self.max_partitions or len(wanted), len(wanted)))]
        for key, replicas in sorted(wanted, key=lambda item: -sizes[item[0]]):
            size, i, members = heapq.heappop(groups)
            members.append((*key, [(broker, [s.path for s in segs])
                                   for (broker, _dir), segs in sorted(replicas.items())]))
            heapq.heappush(groups, (size + sizes[key], i, members))
        return ([_IncarnationsPartition(members) for _s, _i, members in sorted(groups)]
                or [InputPartition(None)])

    def read(self, partition) -> Iterator[tuple]:
        for topic, part, topic_id, logs in getattr(partition, "incarnations", ()):
            for base, last, epoch, crc, holders in reader.replica_disagreements(logs):
                yield topic, part, topic_id, base, last, epoch, crc, holders


def _constant_columns(segment: reader.SegmentFile, n: int) -> list:
    import pyarrow as pa

    def repeat(value, kind):
        return pa.repeat(pa.scalar(value, kind), n)  # a copy loop in C, no Python list

    return [
        repeat(segment.broker_id, pa.int32()),
        repeat(segment.data_dir, pa.string()),
        repeat(segment.topic, pa.string()),
        repeat(segment.partition, pa.int32()),
        repeat(segment.path, pa.string()),
        repeat(segment.base_offset, pa.int64()),
        repeat(segment.topic_id, pa.string()),
    ]


def _batch_arrow(segment: reader.SegmentFile, columns: list[str] | None = None):
    """Arrow record batches of one segment with ``columns`` (default: all of BATCH_COLUMNS).

    Only the asked-for columns are built: the Python data source API has no
    column pruning, so the ``columns`` option is how a reader of a few columns
    avoids paying for the rest in Python and in the JVM.
    """
    import pyarrow as pa

    names = columns or [c for c, _ in BATCH_COLUMNS]
    kinds = dict(BATCH_COLUMNS)
    constants = {c: i for i, (c, _) in enumerate(_COMMON_LOG_COLUMNS)}
    scanned = {c: i for i, c in enumerate(reader.BATCH_FIELDS)}
    for rows in reader.scan_segment_file(segment.path):
        fixed = _constant_columns(segment, len(rows))
        # One column at a time, only the asked-for ones: transposing every row with
        # zip(*rows) cost 3x more for the job's columns (0.44 vs 0.13 CPU s per GiB).
        arrays = [fixed[constants[c]] if c in constants
                  else pa.array(list(map(itemgetter(scanned[c]), rows)), _arrow_type(kinds[c]))
                  for c in names]
        yield pa.RecordBatch.from_arrays(arrays, names=names)


def _record_rows(segment: reader.SegmentFile, payload: str) -> Iterator[tuple]:
    """Record rows of one segment, read window by window (memory bounded by the window)."""
    want_bytes = payload in ("bytes", "both")
    want_hash = payload in ("hash", "both")
    prev: tuple[int | None, int | None] = (None, None)
    try:
        for window in reader.segment_windows(segment.path):
            rows = [row for chunk in reader.scan_batch_chunks(
                window.buf, prev=prev, end=window.end, position_base=window.offset)
                for row in chunk]
            if not rows:
                continue
            prev = reader.prev_after(rows[-1])
            for row in rows:
                if reader.scan_ended(row):
                    return  # framing is gone; the batch-level view reports it
                position, base, epoch, crc_valid, size = row[0], row[1], row[4], row[8], row[12]
                try:
                    records = reader.decode_batch_records(window.buf, position - window.offset,
                                                          size)
                except reader.RecordDecodeError as e:
                    yield (position, base, epoch, crc_valid, None, None, None, None, None, None,
                           str(e))
                    continue
                for r in records:
                    yield (position, base, epoch, crc_valid, r.offset, r.timestamp,
                           r.key if want_bytes else None, r.value if want_bytes else None,
                           reader.payload_hash(r.key) if want_hash else None,
                           reader.payload_hash(r.value) if want_hash else None, None)
    except OSError as e:
        yield (None, None, None, False, None, None, None, None, None, None,
               f"cannot read segment: {e}")


def _record_arrow(segment: reader.SegmentFile, payload: str, chunk_rows: int = 8192):
    import pyarrow as pa

    names = [c for c, _ in RECORD_COLUMNS]
    types = [_arrow_type(k) for _, k in RECORD_COLUMNS[len(_COMMON_LOG_COLUMNS):]]

    def to_batch(rows):
        columns = _constant_columns(segment, len(rows))
        for values, kind in zip(zip(*rows, strict=True), types, strict=True):
            columns.append(pa.array(values, kind))
        return pa.RecordBatch.from_arrays(columns, names=names)

    rows: list[tuple] = []
    for row in _record_rows(segment, payload):
        rows.append(row)
        if len(rows) >= chunk_rows:
            yield to_batch(rows)
            rows = []
    if rows:
        yield to_batch(rows)


# ---------------------------------------------------------------- tidewater-checkpoints


class TidewaterCheckpointsDataSource(DataSource):
    @classmethod
    def name(cls) -> str:
        return "tidewater-checkpoints"

    def schema(self) -> str:
        return ddl(CHECKPOINT_COLUMNS)

    def reader(self, schema) -> DataSourceReader:
        return _CheckpointReader(input_paths(self.options))


class _DataDirPartition(InputPartition):
    def __init__(self, data_dir: str, broker_id: int, partition_dirs: list[reader.PartitionDir]):
        super().__init__(data_dir)
        self.data_dir = data_dir
        self.broker_id = broker_id
        self.partition_dirs = partition_dirs


class _CheckpointReader(DataSourceReader):
    def __init__(self, paths: list[str]):
        self.paths = paths

    def partitions(self):
        inventory = reader.discover(self.paths)
        return [
            _DataDirPartition(d, broker, [p for p in inventory.partition_dirs if p.data_dir == d])
            for d, broker in inventory.data_dirs.items()
        ] or [InputPartition(None)]

    def read(self, partition) -> Iterator[tuple]:
        if getattr(partition, "data_dir", None) is None:
            return
        yield from checkpoint_rows(partition.data_dir, partition.broker_id,
                                   partition.partition_dirs)


def checkpoint_rows(data_dir: str, broker_id: int,
                    partition_dirs: list[reader.PartitionDir]) -> Iterator[tuple]:
    """Rows (CHECKPOINT_COLUMNS order) for one data dir; a bad file is one row with ``error``."""
    from pathlib import Path

    topic_ids = {(p.topic, p.partition): p.topic_id for p in partition_dirs}
    for file_name, kind in reader.OFFSET_CHECKPOINTS.items():
        path = Path(data_dir) / file_name
        if not path.exists():
            continue
        try:
            entries = reader.parse_offset_checkpoint(path.read_text(encoding="utf-8"), str(path))
        except (OSError, UnicodeDecodeError, reader.CheckpointFormatError) as e:
            yield (broker_id, data_dir, str(path), kind, None, None, None, None, None, str(e), "")
            continue
        for i, (topic, part, offset) in enumerate(entries):
            yield (broker_id, data_dir, str(path), kind, topic, part, i, None, offset, None,
                   topic_ids.get((topic, part), ""))
    for pdir in partition_dirs:
        path = Path(pdir.path) / reader.EPOCH_CHECKPOINT
        if not path.exists():
            continue
        try:
            entries = reader.parse_epoch_checkpoint(path.read_text(encoding="utf-8"), str(path))
        except (OSError, UnicodeDecodeError, reader.CheckpointFormatError) as e:
            yield (broker_id, data_dir, str(path), CHECKPOINT_KIND_LEADER_EPOCH, pdir.topic,
                   pdir.partition, None, None, None, str(e), pdir.topic_id)
            continue
        for i, (epoch, start) in enumerate(entries):
            yield (broker_id, data_dir, str(path), CHECKPOINT_KIND_LEADER_EPOCH, pdir.topic,
                   pdir.partition, i, epoch, start, None, pdir.topic_id)


# ---------------------------------------------------------------- tidewater-metrics


class TidewaterMetricsDataSource(DataSource):
    @classmethod
    def name(cls) -> str:
        return "tidewater-metrics"

    def schema(self) -> str:
        return ddl(METRIC_COLUMNS)

    def reader(self, schema) -> DataSourceReader:
        return _MetricsReader(input_paths(self.options))


class _MetricsReader(DataSourceReader):
    def __init__(self, paths: list[str]):
        self.paths = paths

    def partitions(self):
        files = metrics_reader.discover_metric_files(self.paths)
        return [InputPartition(f) for f in files] or [InputPartition(None)]

    def read(self, partition) -> Iterator[tuple]:
        if partition.value is None:
            return
        for s in metrics_reader.read_metric_file(partition.value):
            yield (s.timestamp_ms, s.source, s.name, s.labels, s.value)


DATA_SOURCES = (TidewaterLogDataSource, TidewaterCheckpointsDataSource,
                TidewaterMetricsDataSource)


def register(spark) -> None:
    """Register the three formats on ``spark`` (idempotent)."""
    for source in DATA_SOURCES:
        spark.dataSource.register(source)
