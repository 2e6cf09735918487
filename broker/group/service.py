"""The group operations both front ends call (Kafka's group APIs in
``broker/kafka/group_apis.py``, the gRPC ones in ``broker/group/grpc_service.py``): each
takes plain values, runs on the group's coordinator state, and gives the answer or an
awaitable of it. A group not coordinated here answers NOT_COORDINATOR or
COORDINATOR_LOAD_IN_PROGRESS in the answer's own shape.

Work that must keep request order (registering a join, a commit's write) happens before
an awaitable is returned; only the wait for the answer is deferred.
"""

from __future__ import annotations

from collections.abc import Awaitable
from typing import TypeVar

from tidewater.broker.group.coordinator import CoordinatorError, GroupCoordinator
from tidewater.broker.group.state import (
    CodeAnswer,
    CommitAnswer,
    CommittedOffset,
    Group,
    JoinAnswer,
    OffsetDeleteAnswer,
    SyncAnswer,
)
from tidewater.broker.replicas.metadata_cache import MetadataCache
from tidewater.proto import tidewater_pb2 as pb
from tidewater.proto.errors import InvariantViolation

TopicPartition = tuple[str, int]
_T = TypeVar("_T")


async def _value(value: _T) -> _T:
    return value


def join(coordinator: GroupCoordinator, *, group_id: str, member_id: str,
         group_instance_id: str | None, client_id: str, client_host: str, protocol_type: str,
         protocols: list[tuple[str, bytes]], session_timeout_ms: int,
         rebalance_timeout_ms: int, require_known_member_id: bool) -> Awaitable[JoinAnswer]:
    try:
        return coordinator.request(group_id, lambda state, token, now_ms: state.join_group(
            token, now_ms, group_id=group_id, member_id=member_id,
            group_instance_id=group_instance_id, client_id=client_id, client_host=client_host,
            protocol_type=protocol_type, protocols=protocols,
            session_timeout_ms=session_timeout_ms, rebalance_timeout_ms=rebalance_timeout_ms,
            require_known_member_id=require_known_member_id))  # type: ignore[return-value]
    except CoordinatorError as e:
        return _value(JoinAnswer(e.error_code, member_id=member_id))


def sync(coordinator: GroupCoordinator, *, group_id: str, generation_id: int, member_id: str,
         protocol_type: str | None, protocol_name: str | None,
         assignments: dict[str, bytes], group_instance_id: str | None = None
         ) -> Awaitable[SyncAnswer]:
    try:
        return coordinator.request(group_id, lambda state, token, now_ms: state.sync_group(
            token, now_ms, group_id=group_id, generation_id=generation_id, member_id=member_id,
            protocol_type=protocol_type, protocol_name=protocol_name,
            assignments=assignments, group_instance_id=group_instance_id))  # type: ignore[return-value]
    except CoordinatorError as e:
        return _value(SyncAnswer(e.error_code))


def heartbeat(coordinator: GroupCoordinator, *, group_id: str, generation_id: int,
              member_id: str, group_instance_id: str | None = None) -> pb.ErrorCode:
    try:
        state, now_ms, _ = coordinator.now(group_id)
    except CoordinatorError as e:
        return e.error_code
    return state.heartbeat(now_ms, group_id=group_id, generation_id=generation_id,
                           member_id=member_id, group_instance_id=group_instance_id)


def leave(coordinator: GroupCoordinator, *, group_id: str, member_ids: list[str],
          group_instance_ids: list[str | None] | None = None) -> tuple[pb.ErrorCode, list[pb.ErrorCode]]:
    """(the request's error code, each member's)."""
    try:
        state, now_ms, shard = coordinator.now(group_id)
    except CoordinatorError as e:
        return e.error_code, [e.error_code] * len(member_ids)
    codes, ready = state.leave_group(now_ms, group_id=group_id, member_ids=member_ids,
                                     group_instance_ids=group_instance_ids)
    coordinator.carry_out(shard, ready)
    return pb.NONE, codes


def commit(coordinator: GroupCoordinator, metadata_cache: MetadataCache, *, group_id: str,
           generation_id: int, member_id: str,
           offsets: dict[TopicPartition, tuple[int, int, str]],
           group_instance_id: str | None = None
           ) -> Awaitable[dict[TopicPartition, pb.ErrorCode]]:
    """Each partition's error code; partitions of no known topic are refused."""
    refused = {tp: pb.UNKNOWN_TOPIC_OR_PARTITION for tp in offsets
               if metadata_cache.partition_state(*tp) is None}
    wanted = {tp: v for tp, v in offsets.items() if tp not in refused}
    if not wanted:
        return _value(refused)
    try:
        pending = coordinator.request(group_id, lambda state, token, now_ms: state.commit_offsets(
            token, now_ms, group_id=group_id, generation_id=generation_id,
            member_id=member_id, offsets=wanted, group_instance_id=group_instance_id))
    except CoordinatorError as e:
        return _value({tp: e.error_code for tp in offsets})

    async def answer() -> dict[TopicPartition, pb.ErrorCode]:
        result = await pending
        if not isinstance(result, CommitAnswer):
            raise InvariantViolation(f"a commit answered with {result!r}")
        return {**refused, **result.errors}
    return answer()


def txn_commit(coordinator: GroupCoordinator, metadata_cache: MetadataCache, *,
               group_id: str, producer_id: int, producer_epoch: int, generation_id: int,
               member_id: str, group_instance_id: str | None,
               offsets: dict[TopicPartition, tuple[int, int, str]]
               ) -> Awaitable[dict[TopicPartition, pb.ErrorCode]]:
    """TxnOffsetCommit: each partition's error code once the offsets are durable (and
    held until the transaction's marker); partitions of no known topic are refused."""
    refused = {tp: pb.UNKNOWN_TOPIC_OR_PARTITION for tp in offsets
               if metadata_cache.partition_state(*tp) is None}
    wanted = {tp: v for tp, v in offsets.items() if tp not in refused}
    if not wanted:
        return _value(refused)
    try:
        pending = coordinator.request(group_id, lambda state, token, now_ms:
                                      state.txn_commit_offsets(
                                          token, now_ms, group_id=group_id,
                                          producer_id=producer_id,
                                          producer_epoch=producer_epoch,
                                          generation_id=generation_id, member_id=member_id,
                                          group_instance_id=group_instance_id,
                                          offsets=wanted))
    except CoordinatorError as e:
        return _value({tp: e.error_code for tp in offsets})

    async def answer() -> dict[TopicPartition, pb.ErrorCode]:
        result = await pending
        if not isinstance(result, CommitAnswer):
            raise InvariantViolation(f"a TxnOffsetCommit answered with {result!r}")
        return {**refused, **result.errors}
    return answer()


def fetch_offsets(coordinator: GroupCoordinator, group_id: str,
                  partitions: list[TopicPartition] | None, *, require_stable: bool = False
                  ) -> tuple[pb.ErrorCode, dict[TopicPartition, CommittedOffset | None],
                             set[TopicPartition]]:
    """(error code, committed offset per partition; every committed one for None, the
    partitions to answer UNSTABLE_OFFSET_COMMIT: with ``require_stable``, those an open
    transaction holds an offset of, as Kafka's getOffsets)."""
    try:
        state, _, _ = coordinator.now(group_id)
    except CoordinatorError as e:
        return e.error_code, {tp: None for tp in partitions or ()}, set()
    found = state.fetch_offsets(group_id, partitions)
    if not require_stable:
        return pb.NONE, found, set()
    unstable = state.unstable_partitions(group_id)
    if partitions is None:
        found.update({tp: None for tp in unstable if tp not in found})
    return pb.NONE, found, unstable & set(found)


def describe(coordinator: GroupCoordinator, group_id: str
             ) -> tuple[pb.ErrorCode, Group | None]:
    """(error code, the group or None when it does not exist: Kafka's "Dead")."""
    try:
        state, _, _ = coordinator.now(group_id)
    except CoordinatorError as e:
        return e.error_code, None
    return pb.NONE, state.groups.get(group_id)


def listed_groups(coordinator: GroupCoordinator) -> tuple[pb.ErrorCode, list[Group]]:
    """Every group of the partitions this broker coordinates; COORDINATOR_LOAD_IN_PROGRESS
    while one of them still loads (the list may miss its groups)."""
    groups = [g for state in coordinator.loaded_states() for g in state.groups.values()]
    return (pb.COORDINATOR_LOAD_IN_PROGRESS if coordinator.loading() else pb.NONE), groups


def delete(coordinator: GroupCoordinator, group_id: str) -> Awaitable[pb.ErrorCode]:
    try:
        pending = coordinator.request(group_id, lambda state, token, now_ms:
                                      state.delete_group(token, now_ms, group_id))
    except CoordinatorError as e:
        return _value(e.error_code)

    async def answer() -> pb.ErrorCode:
        result = await pending
        if not isinstance(result, CodeAnswer):
            raise InvariantViolation(f"a group request answered with {result!r}")
        return result.error_code
    return answer()


def delete_offsets(coordinator: GroupCoordinator, group_id: str,
                   partitions: list[TopicPartition]) -> Awaitable[OffsetDeleteAnswer]:
    """OffsetDelete: the group's error code and each partition's, once the tombstones of
    the deleted offsets are written (``GroupCoordinatorState.delete_offsets``)."""
    try:
        pending = coordinator.request(group_id, lambda state, token, now_ms:
                                      state.delete_offsets(token, now_ms, group_id, partitions))
    except CoordinatorError as e:
        return _value(OffsetDeleteAnswer(e.error_code, {}))

    async def answer() -> OffsetDeleteAnswer:
        result = await pending
        if not isinstance(result, OffsetDeleteAnswer):
            raise InvariantViolation(f"an OffsetDelete answered with {result!r}")
        return result
    return answer()
