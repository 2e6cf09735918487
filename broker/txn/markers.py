"""The port through which the transaction coordinator has markers written, and the loop
that retries them (Kafka's TransactionMarkerChannelManager).

When a transaction is decided (PrepareCommit or PrepareAbort is durable in
``__transaction_state``), each partition it touched needs a COMMIT or ABORT control
batch from the partition's leader. The coordinator does not write them itself: it
asks the leader of each partition through ``TxnMarkerSender.write_markers`` (the
meaning of Kafka's WriteTxnMarkers, key 27), one call per leader, and retries every
partition whose answer is not NONE until all have their marker. Only then does the
coordinator write CompleteCommit/CompleteAbort.

The broker's sender is ``marker_sender.LeaderMarkerSender`` (built in
``broker/process.py``): ``await write_markers(leader_broker_id, markers)`` returns, for
each ``TxnMarker`` in order, the error code of each of its partitions; raising means
"nothing known written" (the whole call is retried). ``UnwiredMarkerSender`` refuses
every call (tests: a decided transaction stays in PrepareCommit/PrepareAbort and its
markers are retried, which is what a coordinator must do while leaders cannot take them).

Answers, as Kafka's TransactionMarkerRequestCompletionHandler reads them:

* NONE: written.
* a partition of a topic the metadata no longer has: dropped (the topic was deleted).
* INVALID_PRODUCER_EPOCH, TRANSACTION_COORDINATOR_FENCED: a newer coordinator (or
  producer epoch) exists; this coordinator stops sending the job (the new coordinator's
  load sends its own).
* anything else (NOT_LEADER_OR_FOLLOWER, NOT_ENOUGH_REPLICAS, REQUEST_TIMED_OUT, a
  leader unreachable, ...): retried after ``MARKER_RETRY_BACKOFF_MS`` growing to
  ``MARKER_RETRY_BACKOFF_MS_MAX``, with the leader looked up again.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from tidewater.broker.replicas.metadata_cache import MetadataCache
from tidewater.broker.txn.state import MarkerJob, TopicPartition
from tidewater.proto import tidewater_pb2 as pb
from tidewater.proto.errors import InvariantViolation, TidewaterError

log = logging.getLogger("tidewater.broker.txn")

MARKER_RETRY_BACKOFF_MS = 100
MARKER_RETRY_BACKOFF_MS_MAX = 5000
FENCED_CODES = frozenset({pb.INVALID_PRODUCER_EPOCH, pb.TRANSACTION_COORDINATOR_FENCED})


@dataclass(frozen=True)
class TxnMarker:
    """One entry of WriteTxnMarkers (Kafka's WritableTxnMarker): a COMMIT (committed)
    or ABORT control batch of ``producer_id``/``producer_epoch`` for each partition."""

    producer_id: int
    producer_epoch: int
    committed: bool
    coordinator_epoch: int
    partitions: tuple[TopicPartition, ...]


class TxnMarkerSender(Protocol):
    """Has a partition leader write markers; see the module docstring."""

    async def write_markers(self, leader_broker_id: int, markers: Sequence[TxnMarker]
                            ) -> list[dict[TopicPartition, pb.ErrorCode]]: ...


class MarkerPortNotWiredError(TidewaterError):
    """No partition leader can take markers yet (the log side of issue 27 is not in
    this build): retried, as an unreachable leader is."""

    error_code = pb.UNSUPPORTED_VERSION
    retriable = True


class UnwiredMarkerSender:
    """The broker's sender until WriteTxnMarkers exists on partition leaders."""

    async def write_markers(self, leader_broker_id: int, markers: Sequence[TxnMarker]
                            ) -> list[dict[TopicPartition, pb.ErrorCode]]:
        raise MarkerPortNotWiredError(
            "transaction markers cannot be written: WriteTxnMarkers is not wired "
            "(broker/txn/markers.py)")


async def send_until_written(job: MarkerJob, sender: TxnMarkerSender,
                             metadata_cache: MetadataCache,
                             still_current: Callable[[], bool]) -> bool:
    """Send ``job``'s markers to the leaders of its partitions until every partition has
    its marker (True), or this coordinator is fenced or no longer leads (False)."""
    remaining = set(job.partitions)
    backoff_ms = MARKER_RETRY_BACKOFF_MS
    warned = False
    while remaining:
        if not still_current():
            return False
        by_leader: dict[int, list[TopicPartition]] = {}
        for tp in sorted(remaining):
            state = metadata_cache.partition_state(*tp)
            if state is None:
                if tp[0] not in metadata_cache.topics():  # deleted: nothing to mark
                    remaining.discard(tp)
                continue
            if state.leader >= 0 and not state.offline:
                by_leader.setdefault(state.leader, []).append(tp)
        for leader, partitions in by_leader.items():
            marker = TxnMarker(job.producer_id, job.producer_epoch, job.committed,
                               job.coordinator_epoch, tuple(partitions))
            try:
                [codes] = await sender.write_markers(leader, [marker])
            except (InvariantViolation, asyncio.CancelledError):
                raise
            except Exception as e:  # an unreachable leader, the port not wired: retried
                if not warned:
                    log.warning("markers of %r (producer %d epoch %d) to broker %d: %s; "
                                "retrying", job.transactional_id, job.producer_id,
                                job.producer_epoch, leader, e)
                    warned = True
                continue
            for tp in partitions:
                code = codes.get(tp, pb.UNKNOWN_SERVER_ERROR)
                if code == pb.NONE:
                    remaining.discard(tp)
                elif code in FENCED_CODES:
                    log.info("markers of %r: %s from broker %d: a newer coordinator or "
                             "epoch; this one stops", job.transactional_id,
                             pb.ErrorCode.Name(code), leader)
                    return False
        if remaining:
            await asyncio.sleep(backoff_ms / 1000)
            backoff_ms = min(backoff_ms * 2, MARKER_RETRY_BACKOFF_MS_MAX)
    return True
