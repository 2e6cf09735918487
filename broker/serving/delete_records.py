"""DeleteRecords on the leaders of this broker (Kafka's ``ReplicaManager.deleteRecords``).

Per partition, in order, with no ``await`` between the decision and the move:

1. the core decides (``ReplicaState.check_delete_records``): this broker must lead,
   the offset (-1: the HW) must be at most the HW, else the typed error; a topic
   whose ``cleanup.policy`` lacks ``delete`` is POLICY_VIOLATION (Kafka's rule);
2. the log moves its start (``Log.maybe_increment_log_start_offset``: memory and the
   epoch cache, fsynced); a disk error goes to the core as a failed leader append;
3. once every partition moved, the data dir's ``log-start-offset-checkpoint`` is
   written and fsynced (in a worker thread): only then is the answer sent, so an
   acknowledged deletion survives a restart of the leader.

Followers take the new start from their next fetch answer (the core's
``on_fetch_answer``) and write it with the periodic checkpoint; the segments
entirely below the start go on the next retention pass. The answer's low
watermark is the leader's log start after its move (Kafka waits, in
``DelayedDeleteRecords``, until every live replica's start reached it; here the
answer does not wait for the followers).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import NamedTuple

from tidewater.broker.clock import mono_ms
from tidewater.broker.error_mapping import error_code_for
from tidewater.broker.replicas.partition import Partition
from tidewater.broker.replicas.ready_carrier import ReadyCarrier
from tidewater.proto import tidewater_pb2 as pb
from tidewater.proto.errors import KafkaStorageError, PolicyViolationError


class DeleteRecordsResult(NamedTuple):
    topic: str
    partition: int
    low_watermark: int  # -1 on an error
    error_code: int
    error_message: str


async def delete_records(wanted: list[tuple[str, int, int]], *,
                         lookup: Callable[[str, int], Partition], carrier: ReadyCarrier,
                         checkpoint: Callable[[], Awaitable[None]]
                         ) -> list[DeleteRecordsResult]:
    """Move the log start of each ``(topic, partition, offset)`` this broker leads;
    answers in ``wanted``'s order (module docstring)."""
    results: list[DeleteRecordsResult] = []
    moved: list[tuple[int, Partition]] = []
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
        moved.append((len(results), partition))
        results.append(DeleteRecordsResult(topic, index, -1, pb.NONE, ""))
    if moved:
        try:
            await checkpoint()
        except Exception as e:
            code, message = error_code_for(e, context="DeleteRecords checkpoint")
            for i, _ in moved:
                results[i] = results[i]._replace(error_code=code, error_message=message)
            return results
    for i, partition in moved:
        results[i] = results[i]._replace(low_watermark=partition.log.log_start_offset)
    return results
