"""The broker's periodic work, each loop a supervised task.

- replication ticks: every ``min(replica.lag.time.max.ms / 4, 250 ms)`` each
  replica's core sees the time (``ReplicaState.tick``: the HW a gone joiner
  held, ISR shrink proposals, AlterPartition resends, acks=all deadlines);
- checkpoints: the HW checkpoint every ``log.flush.offset.checkpoint.interval.ms``,
  with segment.ms rolls and flush.ms flushes and the log starts (when one moved);
  recovery points every 30 s;
- retention: old segments deleted every ``log.retention.check.interval.ms``,
  never past a partition's HW;
- the scrub (``log.scrub.bytes.per.second`` > 0): closed segments re-read at a
  bounded rate; a damaged batch goes to the replica's core (issue 14, bug 6);
- the log cleaner (``log.cleaner.enable``): every ``log.cleaner.backoff.ms`` a pass
  over the compacted logs (``storage/cleaner.py``) in a worker thread, at most
  ``log.cleaner.io.max.bytes.per.second``, never past a partition's HW; ``stop``
  makes a running pass give up at its next batch.

File work runs in worker threads (``_in_thread``) on snapshots taken on the
loop (HWs, the logs), so no fsync or rename stalls a request; ``stop`` waits
for them. A failed checkpoint or retention pass is logged and retried next
round (a disk error must not stop a broker that can still serve); anything
else escaping a loop is a bug and stops the broker (``TaskSupervisor``).
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from tidewater.broker.clock import mono_ms, wall_ms
from tidewater.broker.config import BrokerConfig
from tidewater.broker.metrics import BrokerMetrics
from tidewater.broker.replicas.partition import Partition
from tidewater.broker.replicas.ready_carrier import ReadyCarrier
from tidewater.broker.replicas.ticks import tick_replicas
from tidewater.broker.storage.corruption import SCRUB, CorruptBatch, CorruptionReporter
from tidewater.broker.storage.log import Log
from tidewater.broker.storage.log_manager import LogManager
from tidewater.broker.storage.scrub import LogScrubber
from tidewater.broker.storage.topics import TopicPartition
from tidewater.proto.errors import TidewaterError
from tidewater.proto.supervisor import TaskSupervisor

if TYPE_CHECKING:
    # Imported once the broker settles (make_cleaner) or by the first pass, in a thread.
    from tidewater.broker.storage.cleaner import CleanResult, LogCleaner

log = logging.getLogger("tidewater.broker.replicas.background")
T = TypeVar("T")

RECOVERY_CHECKPOINT_INTERVAL_S = 30.0
REPLICATION_TICK_MS_MAX = 250


class BackgroundWork:
    def __init__(self, *, config: BrokerConfig, log_manager: LogManager, carrier: ReadyCarrier,
                 supervisor: TaskSupervisor, partitions: dict[TopicPartition, Partition],
                 high_watermarks: Callable[[], dict[TopicPartition, int]],
                 corruption: CorruptionReporter, metrics: BrokerMetrics | None = None) -> None:
        self.config = config
        self.log_manager = log_manager
        self._carrier = carrier
        self._supervisor = supervisor
        self._partitions = partitions
        self._high_watermarks = high_watermarks
        self._corruption = corruption
        self._metrics = metrics
        self.cleaner: LogCleaner | None = None
        self._cleaner_lock = threading.Lock()  # made once, by make_cleaner or the first pass
        self._stopping = False
        self._tasks: list[asyncio.Task[None]] = []
        # Checkpoint writes, rolls/flushes and retention passes running in threads.
        self._thread_work: set[asyncio.Future[Any]] = set()

    def start(self) -> None:
        spawn = self._supervisor.spawn
        self._tasks = [
            spawn(self._replication_ticks(), "replication-ticks"),
            spawn(self._checkpoint_loop(), "hw-checkpoint"),
            spawn(self._retention_loop(), "retention"),
        ]
        if self.config.log_scrub_bytes_per_second > 0:
            loop = asyncio.get_running_loop()

            def on_corrupt(tp: TopicPartition, batch: CorruptBatch) -> None:
                loop.call_soon_threadsafe(self.on_scrub_corrupt, tp, batch)

            scrubber = LogScrubber(
                self.log_manager.logs, on_corrupt,
                bytes_per_second=self.config.log_scrub_bytes_per_second,
                interval_ms=self.config.log_scrub_interval_ms, now_ms=mono_ms())
            self._tasks.append(spawn(scrubber.run(), "scrub"))
        if self.config.log_cleaner_enable:
            self._tasks.append(spawn(self._cleaner_loop(), "log-cleaner"))

    async def stop(self) -> None:
        self._stopping = True  # a cleaner made in its thread from now on is stopped there
        if self.cleaner is not None:
            self.cleaner.stop()  # a pass in its thread gives up at the next batch
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._thread_work:
            # Their loops were cancelled: nobody else sees what they raise.
            for outcome in await asyncio.gather(*self._thread_work, return_exceptions=True):
                if isinstance(outcome, Exception):
                    log.error("file work failed during the stop: %r", outcome, exc_info=outcome)

    def on_scrub_corrupt(self, tp: TopicPartition, batch: CorruptBatch) -> None:
        """The scrub found a damaged batch (on the loop now): reported once, and handed to
        the replica's core if it is the log the replica serves (issue 14, bug 6)."""
        self._corruption.report(batch, SCRUB)
        partition = self._partitions.get(tp)
        if partition is None or Path(batch.path).parent != Path(partition.log.dir):
            return  # not hosted (yet), or another incarnation's log
        try:
            self._carrier.apply(partition, partition.replica.on_corrupt_batch(batch.base_offset,
                                                                              mono_ms()))
        except TidewaterError as e:
            log.warning("%s: reacting to the corrupt batch failed: %s", tp, e)

    def tick_all(self, now_ms: int) -> None:
        """One replication tick of every replica (synchronous, on the loop)."""
        tick_replicas(self._partitions.values(), self._carrier, now_ms)

    async def _replication_ticks(self) -> None:
        interval_s = min(self.config.replica_lag_time_max_ms / 4, REPLICATION_TICK_MS_MAX) / 1000
        while True:
            await asyncio.sleep(interval_s)
            self.tick_all(mono_ms())

    async def _checkpoint_loop(self) -> None:
        interval_s = self.config.log_flush_offset_checkpoint_interval_ms / 1000
        last_recovery_checkpoint = time.monotonic()
        while True:
            await asyncio.sleep(interval_s)
            try:
                # The checkpoint files are written (and fsynced) in a thread: an fsync takes
                # milliseconds to tens of ms on a busy disk and stalled every request when it
                # ran on the loop. The HWs are snapshotted here, on the loop.
                await self._in_thread(self.log_manager.checkpoint_high_watermarks,
                                      self._high_watermarks())
                # Log starts a follower took from its leader (DeleteRecords); written
                # only when one moved.
                await self._in_thread(self.log_manager.checkpoint_log_start_offsets)
                # A segment.ms roll queues its flush; a flush.ms flush fsyncs (outside
                # each log's lock). The logs dict is snapshotted here, on the loop.
                await self._in_thread(self.log_manager.maybe_roll_and_flush, wall_ms(),
                                      self.log_manager.logs())
                if time.monotonic() - last_recovery_checkpoint >= RECOVERY_CHECKPOINT_INTERVAL_S:
                    last_recovery_checkpoint = time.monotonic()
                    # Flushes every log (fsyncs outside each log's lock) before writing the points.
                    await self._in_thread(self.log_manager.checkpoint_recovery_points)
            except (OSError, TidewaterError) as e:
                log.error("checkpoint failed: %s", e)  # the next round retries

    async def checkpoint_log_start_offsets(self) -> None:
        """Write (and fsync) the log-start checkpoint in a worker thread (DeleteRecords
        answers after it)."""
        await self._in_thread(self.log_manager.checkpoint_log_start_offsets)

    async def _retention_loop(self) -> None:
        interval_s = self.config.log_retention_check_interval_ms / 1000
        while True:
            await asyncio.sleep(interval_s)
            try:
                # Renames and a checkpoint write: in a thread, with the partitions' HWs
                # and logs snapshotted together here, on the loop.
                partitions = list(self._partitions.items())
                await self._in_thread(self.log_manager.delete_old_segments, wall_ms(),
                                      {tp: p.high_watermark for tp, p in partitions},
                                      {tp: p.log for tp, p in partitions})
            except (OSError, TidewaterError) as e:
                log.error("retention failed: %s", e)  # the next round retries

    async def _cleaner_loop(self) -> None:
        interval_s = self.config.log_cleaner_backoff_ms / 1000
        while True:
            await asyncio.sleep(interval_s)
            partitions = list(self._partitions.items())
            # HWs and logs snapshotted together here, on the loop (as retention does).
            results = await self._in_thread(self._clean_pass,
                                            {tp: p.log for tp, p in partitions},
                                            {tp: p.high_watermark for tp, p in partitions},
                                            wall_ms())
            self._count_cleaned(results or [])

    def _clean_pass(self, logs: dict[TopicPartition, Log],
                    high_watermarks: dict[TopicPartition, int],
                    now_ms: int) -> list[CleanResult]:
        """One cleaner pass (in a worker thread), with the cleaner made if it is not yet."""
        return self._cleaner().clean_logs(logs, high_watermarks, now_ms)

    async def make_cleaner(self) -> None:
        """Make the cleaner now, in a worker thread, if it is enabled: the broker calls
        this once it has settled after serving (``BrokerProcess.settled``)."""
        if self.config.log_cleaner_enable and self.cleaner is None:
            await self._in_thread(self._cleaner)

    def _cleaner(self) -> LogCleaner:
        """The cleaner, made on first use. Not before the broker serves: its modules and
        their dataclasses are 5-8 ms of CPU (issue 30's restart time). Not at its first
        pass either: every broker of a cluster started together then held the GIL that
        long at once, one log.cleaner.backoff.ms after the start, a window of slow acks
        that stall_probe.py found at +14 s in every run (gone with the cleaner made when
        the broker settles)."""
        with self._cleaner_lock:
            if self.cleaner is None:
                from tidewater.broker.storage.cleaner import LogCleaner
                self.cleaner = LogCleaner(
                    self.config.data_dir,
                    io_bytes_per_second=self.config.log_cleaner_io_max_bytes_per_second)
                if self._stopping:  # stop() found no cleaner to stop: this one stops itself
                    self.cleaner.stop()
            return self.cleaner

    def _count_cleaned(self, results: list[CleanResult]) -> None:
        metrics = self._metrics
        if metrics is None:
            return
        for result in results:
            metrics.cleaner_runs.inc()
            metrics.cleaner_bytes.labels("read").inc(result.bytes_read)
            metrics.cleaner_bytes.labels("written").inc(result.bytes_written)
            metrics.cleaner_records_removed.inc(result.filter.records_read
                                                - result.filter.records_kept)

    async def _in_thread(self, fn: Callable[..., T], *args: Any) -> T:
        """Run ``fn`` in a worker thread; ``stop`` waits for every such run, so a cancelled
        loop never leaves a checkpoint write or a retention pass running into the
        shutdown's own checkpoints. Arguments are snapshots taken on the loop."""
        # Not supervised: the loop that called awaits it and handles what it raises (an
        # OSError is retried); stop() awaits one whose loop was cancelled, and logs it.
        work = asyncio.ensure_future(asyncio.to_thread(fn, *args))
        self._thread_work.add(work)
        work.add_done_callback(self._thread_work.discard)
        return await asyncio.shield(work)
