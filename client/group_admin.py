"""Consumer-group administration over gRPC (what ``tide groups`` and
``kafka-consumer-groups.sh`` do): list, describe with lag, delete, reset offsets.

Listing asks every broker (each knows the groups it coordinates). Describing asks the
group's coordinator for the members and the committed offsets, and the partitions'
leaders for their log end offsets (lag = log end - committed). Deleting and resetting
need an empty group (no members): the coordinator refuses a delete with NON_EMPTY_GROUP
and a reset here checks the state first; a reset is an OffsetCommit with generation -1
(the coordinator accepts those for empty groups only).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from types import TracebackType
from typing import Unpack

from tidewater.client import assignors
from tidewater.client.consumer import Consumer, OffsetsFetch, offsets_of_every
from tidewater.client.group import CoordinatorClient
from tidewater.client.metadata import MetadataClient, TopicPartition, rpc_call
from tidewater.client.security import SecurityOptions
from tidewater.proto import tidewater_pb2 as pb
from tidewater.proto.errors import LeaderNotAvailableError, TidewaterError, error_for_code

# A consumer's ListOffsets of some partitions: the offsets it got (partitions left out: none).
RETRY_BACKOFF_S = 0.2

EARLIEST, LATEST = -2, -1


class GroupNotEmptyError(TidewaterError):
    """The group has members: its offsets are theirs to move."""

    error_code = pb.NON_EMPTY_GROUP


@dataclass(frozen=True)
class MemberDescription:
    member_id: str
    client_id: str
    client_host: str
    partitions: list[tuple[str, int]]


@dataclass(frozen=True)
class PartitionLag:
    topic: str
    partition: int
    committed: int  # -1: none
    log_end_offset: int  # -1: unknown
    member_id: str  # "" when no member holds it

    @property
    def lag(self) -> int | None:
        if self.committed < 0 or self.log_end_offset < 0:
            return None
        return max(0, self.log_end_offset - self.committed)


@dataclass
class GroupDescription:
    group_id: str
    state: str
    protocol_type: str
    protocol: str
    members: list[MemberDescription] = field(default_factory=list)
    partitions: list[PartitionLag] = field(default_factory=list)


class GroupAdmin:
    def __init__(self, bootstrap: str, *, request_timeout_ms: int = 30000,
                 **security: Unpack[SecurityOptions]) -> None:
        self.request_timeout_s = request_timeout_ms / 1000
        self.consumer = Consumer(bootstrap, request_timeout_ms=request_timeout_ms, **security)
        self.metadata: MetadataClient = self.consumer.metadata

    def close(self) -> None:
        self.consumer.close()

    def __enter__(self) -> GroupAdmin:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    def _coordinator(self, group_id: str) -> CoordinatorClient:
        return CoordinatorClient(self.metadata, group_id,
                                 request_timeout_s=self.request_timeout_s, retry_backoff_s=0.2)

    def _deadline(self) -> float:
        return time.monotonic() + self.request_timeout_s

    def list_groups(self) -> list[pb.GroupListing]:
        snapshot = self.metadata.refresh()
        groups: dict[str, pb.GroupListing] = {}
        for address in snapshot.brokers.values():
            answer: pb.ListGroupsResponse = rpc_call(self.metadata.pool.broker(address).ListGroups,
                              pb.ListGroupsRequest(), timeout_s=self.request_timeout_s,
                              address=address)
            for g in answer.groups:
                groups[g.group_id] = g
        return [groups[g] for g in sorted(groups)]

    def describe_group(self, group_id: str) -> GroupDescription:
        coordinator = self._coordinator(group_id)
        g = self._described(coordinator)
        description = GroupDescription(group_id, g.state, g.protocol_type, g.protocol_name)
        owner: dict[tuple[str, int], str] = {}
        for m in g.members:
            parts = (assignors.decode_assignment(m.assignment)
                     if g.protocol_type == "consumer" else [])
            description.members.append(MemberDescription(m.member_id, m.client_id,
                                                          m.client_host, parts))
            owner.update({tp: m.member_id for tp in parts})
        committed = self._committed(coordinator)
        wanted = sorted(set(committed) | set(owner))
        ends = self.consumer.end_offsets(wanted) if wanted else {}
        description.partitions = [
            PartitionLag(t, p, committed.get((t, p), -1),
                         ends.get(TopicPartition(t, p), -1), owner.get((t, p), ""))
            for t, p in wanted]
        return description

    def _described(self, coordinator: CoordinatorClient) -> pb.GroupDescription:
        answer: pb.DescribeGroupsResponse = coordinator.retrying_per_key(
            "DescribeGroups", pb.DescribeGroupsRequest(group_ids=[coordinator.group_id]),
            self._deadline(), lambda a: a.groups[0].error_code if a.groups else pb.NONE)
        [g] = answer.groups
        if g.error_code != pb.NONE:
            raise error_for_code(g.error_code, f"DescribeGroups of {coordinator.group_id!r}")
        return g

    def _committed(self, coordinator: CoordinatorClient) -> dict[tuple[str, int], int]:
        answer: pb.OffsetFetchResponse = coordinator.retrying("OffsetFetch",
                                      pb.OffsetFetchRequest(group_id=coordinator.group_id),
                                      self._deadline())
        if answer.error_code != pb.NONE:
            raise error_for_code(answer.error_code, "OffsetFetch")
        return {(o.topic, o.partition): o.offset for o in answer.offsets if o.offset >= 0}

    def delete_group(self, group_id: str) -> None:
        answer: pb.DeleteGroupsResponse = self._coordinator(group_id).retrying(
            "DeleteGroups", pb.DeleteGroupsRequest(group_ids=[group_id]), self._deadline())
        [result] = answer.results
        if result.error_code != pb.NONE:
            raise error_for_code(result.error_code, f"group {group_id!r}")

    def delete_offsets(self, group_id: str, partitions: dict[str, list[int] | None]
                       ) -> dict[tuple[str, int], int]:
        """OffsetDelete (Kafka's ``--delete-offsets``): the group's committed offsets of
        ``partitions`` (topic -> its partitions; None: all of them). Returns each
        partition's error code (NONE: deleted, or nothing was committed;
        GROUP_SUBSCRIBED_TO_TOPIC: a member still consumes the topic); a group-level
        refusal (GROUP_ID_NOT_FOUND, NON_EMPTY_GROUP, ...) raises."""
        request = pb.OffsetDeleteRequest(group_id=group_id)
        for topic, chosen in partitions.items():
            for partition in chosen if chosen is not None else \
                    self.consumer.partitions_for(topic):
                request.partitions.add(topic=topic, partition=partition)
        answer: pb.OffsetDeleteResponse = self._coordinator(group_id).retrying(
            "OffsetDelete", request, self._deadline())
        if answer.error_code != pb.NONE:
            raise error_for_code(answer.error_code, f"deleting offsets of group {group_id!r}")
        return {(o.topic, o.partition): o.error_code for o in answer.partitions}

    def committed_offsets(self, group_id: str) -> dict[tuple[str, int], int]:
        """The group's committed offsets: (topic, partition) -> offset."""
        return self._committed(self._coordinator(group_id))

    def plan_reset(self, group_id: str, partitions: dict[str, list[int] | None] | None, *,
                   to: str, offset: int | None = None, timestamp_ms: int | None = None,
                   shift: int | None = None) -> dict[tuple[str, int], int]:
        """What a reset of ``group_id`` would commit, as kafka-consumer-groups.sh plans it:
        (topic, partition) -> new offset. ``partitions``: topic -> its partitions (None:
        all of the topic's); None: every partition the group has committed (Kafka's
        ``--all-topics``). ``to``: earliest, latest, current (the committed offset; the log
        end without one), offset (``offset``), shift (committed + ``shift``), datetime (the
        first record at or after ``timestamp_ms``; the log end if none). Offsets are
        clamped to [log start, log end], as Kafka. GroupNotEmptyError for a group with
        members; ValueError for a shift of a partition without a committed offset."""
        coordinator = self._coordinator(group_id)
        g = self._described(coordinator)
        if g.state not in ("Empty", "Dead"):
            raise GroupNotEmptyError(
                f"group {group_id!r} is {g.state} with {len(g.members)} member(s): offsets "
                "can be reset only when it is empty (stop its consumers first)")
        committed = self._committed(coordinator)
        if partitions is None:
            tps = [TopicPartition(t, p) for t, p in sorted(committed)]
        else:
            tps = []
            for topic, chosen in partitions.items():
                existing = self.consumer.partitions_for(topic)
                missing = sorted(set(chosen or ()) - set(existing))
                if missing:
                    raise error_for_code(pb.UNKNOWN_TOPIC_OR_PARTITION,
                                         f"{topic} has no partition {missing[0]}")
                tps += [TopicPartition(topic, p) for p in (chosen or existing)]
        if not tps:
            return {}
        earliest = self._offsets_of_every("earliest", self.consumer.beginning_offsets, tps)
        latest = self._offsets_of_every("latest", self.consumer.end_offsets, tps)

        def clamp(tp: TopicPartition, value: int) -> int:
            return min(max(value, earliest[tp]), latest[tp])

        if to == "earliest":
            targets = earliest
        elif to == "latest":
            targets = latest
        elif to == "current":
            targets = {tp: committed.get((tp.topic, tp.partition), latest[tp]) for tp in tps}
        elif to == "offset":
            assert offset is not None
            targets = {tp: clamp(tp, offset) for tp in tps}
        elif to == "shift":
            assert shift is not None
            without = [tp for tp in tps if (tp.topic, tp.partition) not in committed]
            if without:
                raise ValueError(f"cannot shift the offset of {without[0].topic}-"
                                 f"{without[0].partition}: the group has no committed offset")
            targets = {tp: clamp(tp, committed[(tp.topic, tp.partition)] + shift) for tp in tps}
        elif to == "datetime":
            assert timestamp_ms is not None
            found = self.consumer.offsets_for_times(tps, timestamp_ms)
            targets = {tp: found.get(tp, -1) if found.get(tp, -1) >= 0 else latest[tp]
                       for tp in tps}
        else:
            raise ValueError(f"unknown reset target {to!r}")
        return {(tp.topic, tp.partition): targets[tp] for tp in tps}

    def _offsets_of_every(self, what: str, fetch: OffsetsFetch,
                          tps: list[TopicPartition]) -> dict[TopicPartition, int]:
        """``fetch`` (a ListOffsets) of every partition of ``tps``. It leaves out partitions
        with no known leader or a retriable error (a leader moving): those are asked again
        until the request timeout, then ``LeaderNotAvailableError`` names them (a reset
        plans every partition or none)."""
        found, missing = offsets_of_every(fetch, tps, self._deadline(), RETRY_BACKOFF_S)
        if not missing:
            return found
        names = ", ".join(f"{tp.topic}-{tp.partition}" for tp in missing[:5])
        more = f" and {len(missing) - 5} more" if len(missing) > 5 else ""
        raise LeaderNotAvailableError(
            f"no {what} offset of {names}{more} within {self.request_timeout_s:g} s "
            "(no leader reachable): nothing was reset")

    def commit_offsets(self, group_id: str, targets: dict[tuple[str, int], int]) -> None:
        """Commit ``targets`` for the empty group (an OffsetCommit with generation -1)."""
        coordinator = self._coordinator(group_id)
        request = pb.OffsetCommitRequest(group_id=group_id, generation_id=-1)
        for (topic, partition), target in targets.items():
            request.offsets.add(topic=topic, partition=partition, offset=target,
                                leader_epoch=-1)
        committed: pb.OffsetCommitResponse = coordinator.retrying(
            "OffsetCommit", request, self._deadline())
        codes = {o.error_code for o in committed.offsets} - {pb.NONE}
        if codes:
            raise error_for_code(min(codes), f"resetting offsets of {group_id!r}")

    def reset_offsets(self, group_id: str, topic: str, *, to: str, offset: int | None = None,
                      timestamp_ms: int | None = None, dry_run: bool = False
                      ) -> dict[int, int]:
        """Move ``group_id``'s committed offsets of every partition of ``topic``
        (``plan_reset``); commits unless ``dry_run``. Returns partition -> new offset."""
        targets = self.plan_reset(group_id, {topic: None}, to=to, offset=offset,
                                  timestamp_ms=timestamp_ms)
        if not dry_run:
            self.commit_offsets(group_id, targets)
        return {p: off for (_, p), off in targets.items()}
