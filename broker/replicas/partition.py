"""One local replica of a partition in the broker's shell: its Log, its lock, its core.

``replica`` (``ReplicaState``) makes every replication decision; this class only
carries out the log operations a decision asks for (``persist``). Every call
into ``replica`` happens synchronously on the broker's one event loop, so each
decision and the I/O it asks for run without another coroutine in between;
``lock`` orders the appends of concurrent produce requests (FIFO) and is held
while a decision's ``Ready`` is carried out.

Ordering rules enforced here (with ``ReadyCarrier``): a new leader's epoch is
in the epoch cache, fsynced, before anything else of its Ready happens, so no
append or answer in the new epoch can precede it.
"""

from __future__ import annotations

import asyncio
import logging

from tidewater.broker.replication.ready import AppendFetched, AssignEpoch, Truncate, TruncateFully
from tidewater.broker.replication.replica import ReplicaState
from tidewater.broker.storage.topics import TopicPartition
from tidewater.proto.batch import BytesLike, iter_batches

log = logging.getLogger("tidewater.broker.replicas.partition")


class Partition:
    __slots__ = ("tp", "log", "replica", "lock", "topic_id", "metadata_offset")

    def __init__(self, tp: TopicPartition, log_, replica: ReplicaState, topic_id: bytes = b""):
        self.tp = tp
        self.log = log_
        self.replica = replica
        self.lock = asyncio.Lock()
        # The topic incarnation this replica (and its log's partition.metadata) belongs to.
        self.topic_id = topic_id
        # The controller's metadata offset of the newest LeaderAndIsr for it: only a snapshot
        # at least as new may sweep it (topic_identity).
        self.metadata_offset = -1

    # views
    @property
    def high_watermark(self) -> int:
        return self.replica.high_watermark

    @property
    def log_end_offset(self) -> int:
        return self.log.log_end_offset

    @property
    def is_leader(self) -> bool:
        return self.replica.leader is not None

    @property
    def leader_epoch(self) -> int:
        return self.replica.leader_epoch

    def persist(self, op, fetched: BytesLike, now_ms: int) -> int:
        """Carry out one ``Ready.persist`` operation; returns the bytes appended."""
        if isinstance(op, AppendFetched):
            records = self._records_from_log_end(fetched)
            if records:
                self.log.append_as_follower(records, now_ms)
            return len(records)
        if isinstance(op, AssignEpoch):
            self.log.leader_epoch_cache.assign(op.epoch, op.start_offset)  # fsynced
        elif isinstance(op, Truncate):
            self.log.truncate_to(op.offset)
        elif isinstance(op, TruncateFully):
            self.log.truncate_fully_and_start_at(op.start_offset)
        else:
            raise TypeError(f"unknown persist operation {op!r}")
        return 0

    def _records_from_log_end(self, records: BytesLike) -> BytesLike:
        """The part of a fetched chunk that starts exactly at our LEO.

        The leader answers with whole batches from the one holding the fetch offset.
        Batches wholly below our LEO are skipped; a batch straddling it means our
        batch boundaries differ from the leader's there (it should not happen after
        truncation by epochs), so our log is cut back to that batch's base and the
        leader's batch taken instead; if our own batches do not end exactly there
        either, the next fetch starts from the new LEO.
        """
        log_end_offset = self.log.log_end_offset
        for position, header in iter_batches(records, validate=False):
            if header.next_offset <= log_end_offset:
                continue
            if header.base_offset < log_end_offset:
                log.warning("%s: leader batch %d..%d straddles our LEO %d: truncating to %d",
                            self.tp, header.base_offset, header.last_offset, log_end_offset,
                            header.base_offset)
                self.log.truncate_to(header.base_offset)
                if self.log.log_end_offset != header.base_offset:
                    return b""
            return records[position:]
        return b""
