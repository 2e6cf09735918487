"""All partition logs of one data dir, and the data dir's checkpoint files.

Data dir layout::

    <data_dir>/
        <topic>-<partition>/               one Log each (see log.py, recovery.py)
            partition.metadata             its topic ID (partition_metadata.py)
        replication-offset-checkpoint      high watermarks         } Kafka's text format,
        recovery-point-offset-checkpoint   flushed-up-to offsets   } see checkpoints.py
        log-start-offset-checkpoint        log start offsets       }
        meta.properties                    the cluster ID (meta_properties.py; written by
                                           the broker's ClusterIdentity, not here)
        .kafka_cleanshutdown               present only after a clean shutdown
        <topic>-<partition>.<32 hex>-delete  a log moved aside for deletion: never loaded,
                                           removed by the LogDirDeleter (log_deleter.py)

Topic IDs: ``load`` reads each log's ``partition.metadata`` (``topic_id(tp)``;
None for a log made before topic IDs); a corrupt one fails the load with a
``CorruptFileError`` naming it, as Kafka fails the log dir: nothing is opened
as some other incarnation's log. ``get_or_create(..., topic_id=...)`` writes
the file of a new log before the log is handed out; ``assign_topic_id`` gives
an old log (no file) its first ID. Which ID a log must have is the replica
manager's decision (``broker/replication/topic_identity.py``), not this module's.

Ordering rules:

- ``load`` opens every log before it removes the clean-shutdown marker, so a
  crash during start-up still recovers next time; it removes the marker before
  returning, so anything written afterwards counts as unclean until the next
  ``shutdown``.
- ``shutdown`` closes (flushes) every log, then writes the recovery-point and
  log-start checkpoints, and only then the marker.
- ``checkpoint_recovery_points`` flushes each log before writing its recovery
  point, so the file never claims more than is on disk.
- No fsync and no file write runs under a lock the event loop waits for: the
  logs fsync outside their own lock (``Log.flush_outside_lock``; a roll's flush
  in the "flush-log" thread), and the checkpoint files are written under
  per-file locks, not the logs-map lock. The periodic work (checkpoints,
  ``maybe_roll_and_flush``, ``delete_old_segments``) runs in worker threads; a
  log deleted or closed meanwhile on the event loop is skipped.
- ``read_high_watermarks`` clamps each stored HW into its log's
  [log_start_offset, log_end_offset]: recovery may have cut the log below it.
- ``delete`` renames the directory to ``-delete`` and fsyncs the data dir
  BEFORE any file in it is removed: should the rename be lost in a crash, the
  directory must come back whole (with its ``partition.metadata``), never as a
  half-deleted log without its topic ID that a new incarnation would adopt.

A damaged checkpoint is logged and treated as empty: recovery points default
to 0 (every segment is re-validated), log start offsets to the first segment,
high watermarks to the log start offset (the leader re-learns them).
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import uuid
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from tidewater.broker.storage.checkpoints import (
    LOG_START_OFFSET_CHECKPOINT,
    RECOVERY_POINT_OFFSET_CHECKPOINT,
    REPLICATION_OFFSET_CHECKPOINT,
    OffsetCheckpointFile,
    has_clean_shutdown_marker,
    remove_clean_shutdown_marker,
    write_clean_shutdown_marker,
)
from tidewater.broker.storage.log import Log, drain_roll_flushes
from tidewater.broker.storage.log_config import LogConfig
from tidewater.broker.storage.log_deleter import DELETE_DIR_SUFFIX, LogDirDeleter
from tidewater.broker.storage.partition_metadata import (
    read_partition_metadata,
    write_partition_metadata,
)
from tidewater.broker.storage.producer_state import PRODUCER_ID_EXPIRATION_MS_DEFAULT
from tidewater.broker.storage.segment import fsync_dir, storage_error
from tidewater.broker.storage.topics import TopicPartition, log_dir_name, parse_log_dir_name
from tidewater.proto.errors import CorruptFileError, InvariantViolation, KafkaStorageError

log = logging.getLogger(__name__)

# Kafka's num.recovery.threads.per.data.dir is 1; here a recovery mostly waits on the
# disk (fsyncs; the GIL is free then), and 4 threads overlapped those waits (_open_logs).
RECOVERY_THREADS_DEFAULT = 4

__all__ = ["DELETE_DIR_SUFFIX", "LogManager"]


class LogManager:
    """Opens, creates, deletes and checkpoints the logs of one data dir."""

    def __init__(self, data_dir: Path, default_config: LogConfig, *,
                 on_deleter_failure: Callable[[BaseException], None] | None = None,
                 on_flush_failure: Callable[[BaseException], None] | None = None,
                 producer_id_expiration_ms: int = PRODUCER_ID_EXPIRATION_MS_DEFAULT,
                 recovery_threads: int = RECOVERY_THREADS_DEFAULT):
        self.data_dir = Path(data_dir)
        self.recovery_threads = recovery_threads  # logs opened at once by ``load``
        self.producer_id_expiration_ms = producer_id_expiration_ms
        self.default_config = default_config
        self.had_clean_shutdown = False
        self.is_new = False  # load() found an empty data dir
        self._logs: dict[TopicPartition, Log] = {}
        self._topic_ids: dict[TopicPartition, bytes | None] = {}  # None: no partition.metadata
        self.deleter = LogDirDeleter(on_failure=on_deleter_failure)
        # A log's background flush (of a roll) that broke an invariant: the broker stops.
        self._on_flush_failure = on_flush_failure
        self._topic_configs: dict[str, LogConfig] = {}
        # The logs moved aside inside moves_aside, not yet listed for settling (None:
        # outside it).
        self._deletions_pending: list[tuple[TopicPartition, Path]] | None = None
        # _lock guards _logs and is held only briefly (never over a log's files): the
        # event loop takes it (logs(), get_or_create). Each checkpoint file has its own
        # lock, held while the file is written and fsynced, taken before _lock (never
        # while holding it): a snapshot and its write are one step, so an older snapshot
        # never overwrites a newer one.
        self._lock = threading.RLock()
        self._hw_file_lock = threading.Lock()
        self._recovery_file_lock = threading.Lock()
        self._start_file_lock = threading.Lock()
        self._hw_file = OffsetCheckpointFile(self.data_dir / REPLICATION_OFFSET_CHECKPOINT)
        self._recovery_file = OffsetCheckpointFile(self.data_dir / RECOVERY_POINT_OFFSET_CHECKPOINT)
        self._start_file = OffsetCheckpointFile(self.data_dir / LOG_START_OFFSET_CHECKPOINT)
        self._start_offsets_written: dict[TopicPartition, int] | None = None

    # -- start-up ------------------------------------------------------------

    def load(self, now_ms: int) -> None:
        """Open every log in the data dir, recovering them after an unclean shutdown."""
        with self._lock:
            try:
                self.data_dir.mkdir(parents=True, exist_ok=True)
                names = sorted(os.listdir(self.data_dir))
            except OSError as e:
                raise storage_error("cannot open data dir", self.data_dir, e) from e
            self.had_clean_shutdown = has_clean_shutdown_marker(self.data_dir)
            # A brand-new (empty) data dir has no marker either, but it was never shut
            # down at all: warn only when there is something to recover.
            self.is_new = not names
            if not self.had_clean_shutdown and not self.is_new:
                log.warning("%s was not shut down cleanly: recovering its logs", self.data_dir)
            recovery_points = self._read_checkpoint(self._recovery_file)
            log_start_offsets = self._read_checkpoint(self._start_file)
            found: list[tuple[TopicPartition, Path]] = []
            for name in names:
                path = self.data_dir / name
                if not path.is_dir():
                    continue
                if name.endswith(DELETE_DIR_SUFFIX):
                    log.info("finishing the deletion of %s in the background", path)
                    self.deleter.submit(path)
                    continue
                try:
                    tp = parse_log_dir_name(name)
                except ValueError:
                    log.warning("ignoring %s: not a partition directory", path)
                    continue
                # Every one read before any log opens: a corrupt file fails the load with
                # no log opened (none recovered, nothing cut).
                self._topic_ids[tp] = read_partition_metadata(path)
                found.append((tp, path))

            def open_log(tp: TopicPartition, path: Path) -> Log:
                return Log.open(
                    path, self._config_for(tp.topic), now_ms=now_ms,
                    recovery_point=recovery_points.get(tp, 0),
                    log_start_offset=log_start_offsets.get(tp),
                    had_clean_shutdown=self.had_clean_shutdown,
                    producer_id_expiration_ms=self.producer_id_expiration_ms,
                    on_background_failure=self._on_flush_failure)

            self._open_logs(found, open_log)
            remove_clean_shutdown_marker(self.data_dir)

    def _open_logs(self, found: list[tuple[TopicPartition, Path]],
                   open_log: Callable[[TopicPartition, Path], Log]) -> None:
        """Open the logs; after an unclean shutdown ``recovery_threads`` at a time
        (Kafka's num.recovery.threads.per.data.dir). Each log's files are its own, and
        most of a recovery is waiting for the disk (fsyncs of the re-validated
        segments and of the directory), which threads overlap: 60 logs recovered in
        0.24-0.32 s with 4 threads against 0.82-1.18 s with one (bench/probes/
        restart_probe.py's data dir, loaded machine). After a clean shutdown an opening
        is mostly Python work under the GIL (no fsync): one thread was faster there
        (0.13-0.20 s against 0.23-0.30 s). Every log that opened is kept (as one by one
        before); the first failure, in name order, is raised once all have finished."""
        if self.recovery_threads <= 1 or len(found) <= 1 or self.had_clean_shutdown:
            for tp, path in found:
                self._logs[tp] = open_log(tp, path)
            return
        with ThreadPoolExecutor(max_workers=min(self.recovery_threads, len(found)),
                                thread_name_prefix="log-recovery") as pool:
            futures = [(tp, pool.submit(open_log, tp, path)) for tp, path in found]
        first_error: BaseException | None = None
        for tp, future in futures:
            error = future.exception()
            if error is None:
                self._logs[tp] = future.result()
            elif first_error is None:
                first_error = error
        if first_error is not None:
            raise first_error

    def _read_checkpoint(self, checkpoint: OffsetCheckpointFile) -> dict[TopicPartition, int]:
        try:
            return checkpoint.read()
        except CorruptFileError as e:
            log.warning("%s; ignoring it", e)
            return {}

    def _config_for(self, topic: str) -> LogConfig:
        return self._topic_configs.get(topic, self.default_config)

    # -- logs ----------------------------------------------------------------

    def get(self, tp: TopicPartition) -> Log | None:
        return self._logs.get(tp)

    def logs(self) -> dict[TopicPartition, Log]:
        with self._lock:
            return dict(self._logs)

    def get_or_create(self, tp: TopicPartition, config: LogConfig, now_ms: int,
                      topic_id: bytes | None = None) -> Log:
        """The log of ``tp``, created empty (with ``config``) if there is none.

        A created log gets ``topic_id`` in its ``partition.metadata`` before it is
        returned. An existing log is returned as it is: its ID is ``topic_id(tp)``.
        """
        tp = TopicPartition(*tp)
        name = log_dir_name(tp)  # raises InvalidTopicError before any path is built
        with self._lock:
            existing = self._logs.get(tp)
            if existing is not None:
                return existing
            self._topic_configs.setdefault(tp.topic, config)
        # The files are made (and fsynced) without _lock, which the event loop takes: the
        # broker creates a topic's logs from a worker thread (``ControlRequests.new_logs``).
        # Only the control requests create logs, one at a time, so none can come between.
        # A new directory has nothing to recover; a stray old one gets validated.
        created = Log.open(self.data_dir / name, config, now_ms=now_ms,
                           producer_id_expiration_ms=self.producer_id_expiration_ms,
                           on_background_failure=self._on_flush_failure)
        try:
            if topic_id is not None:
                write_partition_metadata(created.dir, topic_id)
            with self._lock:
                if tp in self._logs:
                    raise InvariantViolation(f"the log of {tp} was created twice at once")
                self._logs[tp] = created
                self._topic_ids[tp] = topic_id
        except BaseException:
            created.close()
            raise
        return created

    def topic_id(self, tp: TopicPartition) -> bytes | None:
        """The topic ID in the log's ``partition.metadata``; None without one (or no log)."""
        return self._topic_ids.get(tp)

    def topic_ids(self) -> dict[TopicPartition, bytes | None]:
        with self._lock:
            return {tp: self._topic_ids.get(tp) for tp in self._logs}

    def assign_topic_id(self, tp: TopicPartition, topic_id: bytes) -> None:
        """Give a log made before topic IDs (no ``partition.metadata``) its first ID."""
        tp = TopicPartition(*tp)
        with self._lock:
            partition_log = self._logs[tp]
            if self._topic_ids.get(tp) is not None:
                raise InvariantViolation(f"{tp} has a topic id already")
            write_partition_metadata(partition_log.dir, topic_id)
            self._topic_ids[tp] = topic_id

    def update_topic_config(self, topic: str, config: LogConfig) -> None:
        """Apply new topic configs to the topic's logs (and to logs created later)."""
        with self._lock:
            self._topic_configs[topic] = config
            for tp, partition_log in self._logs.items():
                if tp.topic == topic:
                    partition_log.update_config(config)

    def delete(self, tp: TopicPartition) -> Path | None:
        """Move the log of ``tp`` aside for deletion and drop its checkpoint entries.

        The directory becomes ``<topic>-<partition>.<32 hex>-delete`` (Kafka's name),
        the data dir is fsynced, and the ``LogDirDeleter`` removes it in the
        background. Returns the new path (None when there was no log). Inside
        ``moves_aside`` the fsync, the hand-over and the checkpoints wait for
        ``settle_deletions``.
        """
        tp = TopicPartition(*tp)
        with self._lock:
            partition_log = self._logs.pop(tp, None)
            self._topic_ids.pop(tp, None)
            if partition_log is None:
                return None
            # Rename first: a crash mid-delete leaves a "-delete" dir that load() hands to
            # the deleter, never a half-deleted log that looks real.
            doomed = self.data_dir / f"{log_dir_name(tp)}.{uuid.uuid4().hex}{DELETE_DIR_SUFFIX}"
            partition_log.delete(rename_to=doomed, keep_files=True)
        if self._deletions_pending is not None:
            self._deletions_pending.append((tp, doomed))
        else:
            self.settle_deletions([(tp, doomed)])
        return doomed

    @contextlib.contextmanager
    def moves_aside(self) -> Iterator[list[tuple[TopicPartition, Path]]]:
        """The logs ``delete``d inside it are moved aside at once and listed in what it
        yields, for the caller to make durable with ``settle_deletions``, for them all:
        one fsync of the data dir and one write of each checkpoint file. A topic's
        deletion moves all its partitions in one StopReplica, and an fsync and three
        checkpoint writes each (~10 ms a partition on a slow disk) held the broker's
        event loop for half a second for 50 of them; the broker now settles them in a
        worker thread, off its loop. If the body raises, the moves made are settled here
        first. Until they are settled a crash may undo them: the logs come back at the
        next start, as strays to sweep."""
        if self._deletions_pending is not None:
            raise InvariantViolation("moves_aside entered twice")
        moved: list[tuple[TopicPartition, Path]] = []
        self._deletions_pending = moved
        try:
            yield moved
        except BaseException:
            if moved:
                self.settle_deletions(moved)
            raise
        finally:
            self._deletions_pending = None

    def settle_deletions(self, moved: list[tuple[TopicPartition, Path]]) -> None:
        """The moves of ``delete`` made durable, then the directories handed to the
        deleter and the logs' checkpoint entries dropped. Safe from a worker thread."""
        # The renames are durable before a single file goes (module docstring).
        fsync_dir(self.data_dir)
        for _tp, doomed in moved:
            self.deleter.submit(doomed)
        # The checkpoint files are written without _lock (see __init__).
        self.checkpoint_recovery_points(flush=False)
        self.checkpoint_log_start_offsets()
        deleted = {tp for tp, _doomed in moved}
        with self._hw_file_lock:
            hws = self._read_checkpoint(self._hw_file)
            if deleted & hws.keys():
                self._hw_file.write({tp: hw for tp, hw in hws.items() if tp not in deleted})

    # -- checkpoints ---------------------------------------------------------

    def read_high_watermarks(self) -> dict[TopicPartition, int]:
        """Stored HW of every open log, clamped into [log_start_offset, log_end_offset]."""
        with self._lock:
            stored = self._read_checkpoint(self._hw_file)
            result = {}
            for tp, partition_log in self._logs.items():
                hw = stored.get(tp, partition_log.log_start_offset)
                clamped = min(max(hw, partition_log.log_start_offset),
                              partition_log.log_end_offset)
                if clamped != hw and tp in stored:
                    log.warning("high watermark %d of %s clamped to %d (log is [%d, %d])", hw, tp,
                                clamped, partition_log.log_start_offset,
                                partition_log.log_end_offset)
                result[tp] = clamped
            return result

    def checkpoint_high_watermarks(self, hws: Mapping[TopicPartition, int]) -> None:
        """Write the HWs of the logs this data dir holds (others are ignored)."""
        with self._hw_file_lock:
            with self._lock:
                held = {TopicPartition(*tp): hw for tp, hw in hws.items()
                        if TopicPartition(*tp) in self._logs}
            self._hw_file.write(held)

    def checkpoint_recovery_points(self, *, flush: bool = True) -> None:
        """Flush every log (unless ``flush=False``), then write their recovery points.

        Each log fsyncs without its lock (``Log.flush_outside_lock``) and moves its
        recovery point only over what it made durable, so the file, written from
        those points afterwards, never claims more than is on disk. A log deleted
        or closed meanwhile is skipped; a disk error propagates (nothing written).
        """
        if flush:
            for partition_log in self.logs().values():
                partition_log.flush_outside_lock()
        with self._recovery_file_lock:
            with self._lock:
                points = {tp: partition_log.recovery_point
                          for tp, partition_log in self._logs.items()
                          if not partition_log.is_offline}
            self._recovery_file.write(points)

    def checkpoint_log_start_offsets(self) -> None:
        """Write the log starts (fsynced) unless they are what this manager last wrote."""
        with self._start_file_lock:
            with self._lock:
                offsets = {tp: partition_log.log_start_offset
                           for tp, partition_log in self._logs.items()}
            if offsets == self._start_offsets_written:
                return
            self._start_file.write(offsets)
            self._start_offsets_written = offsets

    # -- periodic work -------------------------------------------------------

    def maybe_roll_and_flush(self, now_ms: int,
                             logs: Mapping[TopicPartition, Log] | None = None) -> None:
        """segment.ms rolls and flush.ms flushes for every log (call every ~second, from a
        worker thread: a flush fsyncs). ``logs``: the caller's snapshot of ``logs()``
        (default: taken now). A log closed or deleted since (StopReplica, topic
        deletion) is skipped; one log's disk error does not stop the others."""
        for tp, partition_log in (self.logs() if logs is None else logs).items():
            if partition_log.is_offline or partition_log.is_closed:
                continue
            try:
                partition_log.maybe_roll(now_ms)
                partition_log.maybe_flush(now_ms)
            except KafkaStorageError as e:
                _skip_failed_log(tp, partition_log, "segment.ms roll or flush.ms flush", e)

    def delete_old_segments(self, now_ms: int, high_watermarks: Mapping[TopicPartition, int],
                            logs: Mapping[TopicPartition, Log] | None = None) -> int:
        """Retention for every log with a known HW; checkpoints moved start offsets.

        For a worker thread: ``logs`` and ``high_watermarks`` are the caller's
        snapshots, taken together (each HW then belongs to the log it was read with,
        never to a log recreated since under the same name); default: ``logs()`` now.
        A log closed or deleted since is skipped; one log's disk error does not stop
        the others."""
        deleted = 0
        for tp, partition_log in (self.logs() if logs is None else logs).items():
            hw = high_watermarks.get(tp)
            if hw is None or partition_log.is_offline or partition_log.is_closed:
                continue
            try:
                deleted += partition_log.delete_old_segments(now_ms, hw)
                # Idle idempotent producers expire on the same pass (wall clock, as retention).
                partition_log.remove_expired_producers(now_ms)
            except KafkaStorageError as e:
                _skip_failed_log(tp, partition_log, "retention", e)
        if deleted:
            self.checkpoint_log_start_offsets()
        return deleted

    # -- shutdown ------------------------------------------------------------

    def shutdown(self) -> None:
        """Close every log, write checkpoints, then the clean-shutdown marker.

        The marker is left out if any log failed: the next start recovers. Rolled
        segments' background flushes finish first, so that a disk error one of them
        meets takes its log offline (and the shutdown unclean) instead of being lost.
        """
        drained = drain_roll_flushes()
        if not drained:
            log.error("rolled segments still flushing at shutdown: not marking it clean")
        with self._hw_file_lock, self._recovery_file_lock, self._start_file_lock, self._lock:
            clean = drained
            for tp, partition_log in self._logs.items():
                try:
                    if partition_log.is_offline:
                        clean = False
                    partition_log.close()
                except KafkaStorageError as e:
                    log.error("closing the log of %s failed: %s", tp, e)
                    clean = False
            if clean:
                self._recovery_file.write({tp: partition_log.recovery_point
                                           for tp, partition_log in self._logs.items()})
                self._start_file.write({tp: partition_log.log_start_offset
                                        for tp, partition_log in self._logs.items()})
                write_clean_shutdown_marker(self.data_dir)
            self._logs.clear()
        self.deleter.close()


def _skip_failed_log(tp: TopicPartition, partition_log: Log, what: str,
                     error: KafkaStorageError) -> None:
    if partition_log.is_closed:
        log.debug("%s of %s skipped: the log was closed meanwhile", what, tp)
    else:
        log.error("%s of %s failed: %s", what, tp, error)

