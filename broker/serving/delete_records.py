"""DeleteRecords on the leaders of this broker (Kafka's ``ReplicaManager.deleteRecords``).

Per partition, in order, with no ``await`` between the decision and the move:

1. the core decides (``ReplicaState.check_delete_records``): this broker must lead,
   the offset (-1: the HW) must be at most the HW, else the typed error; a topic
   whose ``cleanup.policy`` lacks ``delete`` is POLICY_VIOLATION (Kafka's rule);
2. the log moves its start (``Log.maybe_increment_log_start_offset``: memory and the
   epoch cache, fsynced); a disk error goes to the core as a failed leader append;
3. once every partition moved, the data dir's ``log-start-offset-checkpoint`` is
   written and fsynced (in a worker thread), so the leader's start survives its
   restart;
4. each partition's answer waits (Kafka's ``DelayedDeleteRecords``, through the
   purgatory's ``AcksWaits`` and the core's ``watch_low_watermark``) until the log
   start of every ISR member reached the offset: followers take the new start from
   their next fetch answer (their parked fetches are woken) and tell theirs in the
   fetch after it. The answer's low watermark is then the smallest of them;
   REQUEST_TIMED_OUT after the request's timeout, NOT_LEADER_OR_FOLLOWER if the
   leadership ends first.

Followers write their start with the periodic checkpoint; the segments entirely
below the start go on the next retention pass.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import NamedTuple

from tidewater.broker.clock import mono_ms
from tidewater.broker.error_mapping import error_code_for, wire_code
from tidewater.broker.replicas.partition import Partition
from tidewater.broker.replicas.ready_carrier import ReadyCarrier
from tidewater.broker.replication.replica_produce import acks_all_wait_ms
from tidewater.broker.serving.purgatory import AcksWait, AcksWaits
from tidewater.proto import tidewater_pb2 as pb
from tidewater.proto.errors import KafkaStorageError, PolicyViolationError


class DeleteRecordsResult(NamedTuple):
    topic: str
    partition: int
    low_watermark: int  # -1 on an error
    error_code: int
    error_message: str


async def delete_records(wanted: list[tuple[str, int, int]], timeout_ms: int, *,
                         lookup: Callable[[str, int], Partition], carrier: ReadyCarrier,
                         checkpoint: Callable[[], Awaitable[None]], acks_waits: AcksWaits
                         ) -> list[DeleteRecordsResult]:
    """Move the log start of each ``(topic, partition, offset)`` this broker leads;
    answers in ``wanted``'s order (module docstring)."""
    results: list[DeleteRecordsResult] = []
    moved: list[tuple[int, Partition, int]] = []
    for topic, index, offset in wanted:
        try:
            partition = lookup(topic, index)
            start = partition.replica.check_delete_records(offset)
            if not partition.log.config.delete:
                raise PolicyViolationError(
                    f"records of {topic}-{index} cannot be deleted: cleanup.policy is "
                    f"{partition.log.config.cleanup_policy}")
            try:
                partition.log.maybe_increment_log_start_offset(start)
            except KafkaStorageError:
                carrier.apply(partition, partition.replica.on_leader_append_failure(mono_ms()))
                raise
        except Exception as e:
            code, message = error_code_for(e, context="DeleteRecords")
            results.append(DeleteRecordsResult(topic, index, -1, code, message))
            continue
        moved.append((len(results), partition, start))
        results.append(DeleteRecordsResult(topic, index, -1, pb.NONE, ""))
    if moved:
        try:
            await checkpoint()
        except Exception as e:
            code, message = error_code_for(e, context="DeleteRecords checkpoint")
            for i, _, _ in moved:
                results[i] = results[i]._replace(error_code=code, error_message=message)
            return results
    wait_ms = acks_all_wait_ms(timeout_ms)
    waits: list[tuple[int, Partition, AcksWait, int]] = []
    for i, partition, start in moved:
        wait = acks_waits.open(partition, wait_ms)
        carrier.apply(partition, partition.replica.watch_low_watermark(
            start, mono_ms(), waiter_id=wait.waiter_id, timeout_ms=timeout_ms))
        waits.append((i, partition, wait, start))
    for i, partition, wait, start in waits:
        outcome = await acks_waits.wait_for(wait)
        if outcome == pb.NONE:
            # (at least the offset: the leadership may have ended since the wait completed)
            results[i] = results[i]._replace(
                low_watermark=max(partition.replica.low_watermark, start))
        else:
            results[i] = results[i]._replace(error_code=outcome, error_message=(
                f"the replicas' log starts did not reach the offset: "
                f"{pb.ErrorCode.Name(wire_code(outcome))}"))
    return results
