"""A consumer's group membership over gRPC: finding the coordinator, JoinGroup/SyncGroup
(the leader assigns, ``client.assignors``), heartbeats on a thread, offset commits.

Theory of operation: ``ensure_active`` runs on the consumer's polling thread. When the
member must (re)join (first poll, a heartbeat said REBALANCE_IN_PROGRESS,
ILLEGAL_GENERATION or UNKNOWN_MEMBER_ID, a commit was refused for a generation) it joins
(a first join is answered MEMBER_ID_REQUIRED with the id to join with, KIP-394), syncs,
and returns the new assignment. Meanwhile the heartbeat thread keeps the session alive
(every ``heartbeat_interval_ms``). A coordinator error (NOT_COORDINATOR,
COORDINATOR_NOT_AVAILABLE, COORDINATOR_LOAD_IN_PROGRESS, a transport failure) makes
the next call look the coordinator up again and retry after ``retry_backoff_ms``.

Error reactions (Kafka's AbstractCoordinator):

=========================  =================================================
UNKNOWN_MEMBER_ID          forget the member id, rejoin as a new member
ILLEGAL_GENERATION         rejoin with the same member id
REBALANCE_IN_PROGRESS      rejoin
coordinator errors         find the coordinator again, retry
=========================  =================================================
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from google.protobuf.message import Message

from tidewater.client import assignors
from tidewater.client.metadata import (
    Address,
    BrokerConnectionError,
    MetadataClient,
    rpc_call,
)
from tidewater.proto import tidewater_pb2 as pb
from tidewater.proto.errors import RequestTimedOutError, TidewaterError, error_for_code

PROTOCOL_TYPE = "consumer"
COORDINATOR_ERRORS = frozenset({pb.NOT_COORDINATOR, pb.COORDINATOR_NOT_AVAILABLE,
                                pb.COORDINATOR_LOAD_IN_PROGRESS})
REJOIN_ERRORS = frozenset({pb.UNKNOWN_MEMBER_ID, pb.ILLEGAL_GENERATION,
                           pb.REBALANCE_IN_PROGRESS})
NO_GENERATION = -1


class CommitFailedError(TidewaterError):
    """The group rebalanced since these offsets' records were fetched: the commit was
    refused (their partitions may now be another member's). Retriable after the rejoin."""

    retriable = True


class _CoordinatorGone(Exception):
    """The coordinator moved or is unreachable: look it up again."""


class CoordinatorClient:
    """Calls to one group's coordinator: found with FindCoordinator on any broker, found
    again after a coordinator error or a transport failure."""

    def __init__(self, metadata: MetadataClient, group_id: str, *, request_timeout_s: float,
                 retry_backoff_s: float, key_type: pb.CoordinatorKeyType = pb.KEY_TYPE_GROUP):
        self.metadata = metadata
        self.group_id = group_id  # the key: a group id, or a transactional id (key_type)
        self.key_type = key_type
        self.request_timeout_s = request_timeout_s
        self.retry_backoff_s = retry_backoff_s
        self._lock = threading.Lock()
        self._coordinator: Address | None = None

    def find(self) -> Address:
        with self._lock:
            if self._coordinator is not None:
                return self._coordinator

        def ask(address: Address) -> pb.FindCoordinatorResponse:
            response: pb.FindCoordinatorResponse = rpc_call(
                self.metadata.pool.broker(address).FindCoordinator,
                pb.FindCoordinatorRequest(group_id=self.group_id, key_type=self.key_type),
                timeout_s=self.request_timeout_s, address=address)
            return response
        answer = self.metadata.any_broker_call(ask)
        if answer.error_code in COORDINATOR_ERRORS:
            raise _CoordinatorGone(pb.ErrorCode.Name(answer.error_code))
        if answer.error_code != pb.NONE:  # not retriable: GROUP_AUTHORIZATION_FAILED, ...
            raise error_for_code(answer.error_code, f"FindCoordinator of {self.group_id!r}: "
                                 f"{answer.error_message}")
        with self._lock:
            self._coordinator = (answer.host, answer.port)
            return self._coordinator

    # The RPC is named, and the generated stubs are untyped: the answer is Any, and callers
    # annotate the response type they expect.
    def call(self, method: str, request: Message, extra_timeout_s: float = 0.0) -> Any:
        """``method`` on the coordinator; _CoordinatorGone when it must be found again."""
        address = self.find()
        try:
            answer = rpc_call(getattr(self.metadata.pool.broker(address), method), request,
                              timeout_s=self.request_timeout_s + extra_timeout_s,
                              address=address)
        except (BrokerConnectionError, RequestTimedOutError) as e:
            self._forget()
            raise _CoordinatorGone(str(e)) from None
        code = getattr(answer, "error_code", pb.NONE)
        if code in COORDINATOR_ERRORS:
            self._forget()
            raise _CoordinatorGone(pb.ErrorCode.Name(code))
        return answer

    def retrying_per_key(self, method: str, request: Message, deadline: float,
                         key_error: Callable[[Any], int]) -> Any:
        """``retrying``, and again while ``key_error(answer)`` (the answer's own error for
        this key, as DescribeGroups gives one per group) is a coordinator error: the
        coordinator moved, or is still loading its partition (a group's first use on a
        new cluster). Past ``deadline`` the answer is returned as it is."""
        while True:
            answer = self.retrying(method, request, deadline)
            if key_error(answer) not in COORDINATOR_ERRORS or time.monotonic() >= deadline:
                return answer
            self._forget()
            time.sleep(self.retry_backoff_s)

    def _forget(self) -> None:
        with self._lock:
            self._coordinator = None

    def retrying(self, method: str, request: Message, deadline: float,
                 extra_timeout_s: float = 0.0) -> Any:
        """``call`` until it is answered or ``deadline`` passes (BrokerConnectionError)."""
        while True:
            try:
                return self.call(method, request, extra_timeout_s)
            except (_CoordinatorGone, BrokerConnectionError) as e:
                if time.monotonic() >= deadline:
                    raise BrokerConnectionError(
                        f"group {self.group_id!r}: no coordinator answered {method}: {e}"
                    ) from None
                time.sleep(self.retry_backoff_s)


class GroupMembership:
    def __init__(self, metadata: MetadataClient, *, group_id: str, client_id: str,
                 session_timeout_ms: int, rebalance_timeout_ms: int, heartbeat_interval_ms: int,
                 assignor: str, request_timeout_ms: int, retry_backoff_ms: int,
                 group_instance_id: str | None = None):
        if assignor not in assignors.ASSIGNORS:
            raise ValueError(f"partition assignment strategy must be one of "
                             f"{sorted(assignors.ASSIGNORS)}")
        self.metadata = metadata
        self.group_id = group_id
        self.client_id = client_id
        # KIP-345: a static member keeps its partitions across a restart within its
        # session timeout; it never sends LeaveGroup (the session timeout removes it).
        self.group_instance_id = group_instance_id
        self.session_timeout_ms = session_timeout_ms
        self.rebalance_timeout_ms = rebalance_timeout_ms
        self.heartbeat_interval_ms = heartbeat_interval_ms
        self.assignor = assignor
        self.retry_backoff_s = retry_backoff_ms / 1000
        self.coordinator = CoordinatorClient(metadata, group_id,
                                             request_timeout_s=request_timeout_ms / 1000,
                                             retry_backoff_s=self.retry_backoff_s)
        self._lock = threading.Lock()
        self.member_id = ""
        self.generation = NO_GENERATION
        self.rejoin_needed = True
        self.last_poll_s = time.monotonic()  # the consumer's; max.poll.interval.ms below
        self._stopped = threading.Event()
        self._heartbeats: threading.Thread | None = None

    # ------------------------------------------------------------ membership

    def ensure_active(self, topics: list[str], deadline: float) -> list[tuple[str, int]] | None:
        """Join and sync if needed: the new assignment, or None when nothing changed (or
        the deadline passed first; the next call carries on)."""
        if not self.rejoin_needed:
            return None
        while True:
            had_id = bool(self.member_id)
            assignment = self._join_and_sync(topics, deadline)
            if assignment is not None:
                self.rejoin_needed = False
                self._start_heartbeats()
                return assignment
            if not had_id and self.member_id:
                continue  # MEMBER_ID_REQUIRED: join with it now, before it expires
            if time.monotonic() >= deadline:
                return None
            time.sleep(self.retry_backoff_s)

    def _join_and_sync(self, topics: list[str], deadline: float) -> list[tuple[str, int]] | None:
        request = pb.JoinGroupRequest(
            group_id=self.group_id, member_id=self.member_id, client_id=self.client_id,
            group_instance_id=self.group_instance_id or "",
            protocol_type=PROTOCOL_TYPE, session_timeout_ms=self.session_timeout_ms,
            rebalance_timeout_ms=self.rebalance_timeout_ms,
            protocols=[pb.GroupProtocol(name=self.assignor,
                                        metadata=assignors.encode_subscription(topics))])
        rebalance_s = self.rebalance_timeout_ms / 1000  # the answer waits for the rebalance
        joined: pb.JoinGroupResponse = self.coordinator.retrying("JoinGroup", request, deadline, rebalance_s)
        if joined.error_code == pb.MEMBER_ID_REQUIRED:
            self.member_id = joined.member_id
            return None
        if joined.error_code == pb.UNKNOWN_MEMBER_ID:
            self.member_id = ""
            return None
        if joined.error_code in REJOIN_ERRORS:
            return None
        if joined.error_code != pb.NONE:
            raise error_for_code(joined.error_code, f"JoinGroup of {self.group_id!r}")
        with self._lock:
            self.member_id, self.generation = joined.member_id, joined.generation_id
        sync = pb.SyncGroupRequest(group_id=self.group_id, generation_id=joined.generation_id,
                                   member_id=joined.member_id)
        if joined.leader_id == joined.member_id:
            sync.assignments.extend(self._assign(joined))
        synced: pb.SyncGroupResponse = self.coordinator.retrying("SyncGroup", sync, deadline, rebalance_s)
        if synced.error_code in REJOIN_ERRORS:
            if synced.error_code == pb.UNKNOWN_MEMBER_ID:
                self.member_id = ""
            return None
        if synced.error_code != pb.NONE:
            raise error_for_code(synced.error_code, f"SyncGroup of {self.group_id!r}")
        return assignors.decode_assignment(synced.assignment)

    def _assign(self, joined: pb.JoinGroupResponse) -> list[pb.GroupAssignment]:
        members = {m.member_id: assignors.decode_subscription(m.metadata)
                   for m in joined.members}
        topics = sorted({t for ts in members.values() for t in ts})
        self.metadata.refresh(topics)
        counts = {}
        for topic in topics:
            try:
                counts[topic] = len(self.metadata.partitions_for(topic))
            except TidewaterError:
                counts[topic] = 0  # not there (yet): nobody gets it
        chosen = assignors.ASSIGNORS[joined.protocol_name](members, counts)
        return [pb.GroupAssignment(member_id=m, assignment=assignors.encode_assignment(parts))
                for m, parts in chosen.items()]

    # ------------------------------------------------------------ heartbeats

    def _start_heartbeats(self) -> None:
        if self._heartbeats is None:
            self._heartbeats = threading.Thread(target=self._heartbeat_loop, daemon=True,
                                                name=f"heartbeat-{self.group_id}")
            self._heartbeats.start()

    def _heartbeat_loop(self) -> None:
        while not self._stopped.wait(self.heartbeat_interval_ms / 1000):
            if self.rejoin_needed:
                continue
            if (time.monotonic() - self.last_poll_s) * 1000 > self.rebalance_timeout_ms:
                # Kafka's max.poll.interval.ms: a consumer that stopped polling leaves, so
                # its partitions go to members that make progress; its next poll rejoins.
                self._leave()
                continue
            with self._lock:
                request = pb.HeartbeatRequest(group_id=self.group_id,
                                              generation_id=self.generation,
                                              member_id=self.member_id)
            try:
                answer: pb.HeartbeatResponse = self.coordinator.call("Heartbeat", request)
            except (_CoordinatorGone, TidewaterError):
                continue
            self._on_group_error(answer.error_code)

    def _on_group_error(self, code: int) -> None:
        if code == pb.UNKNOWN_MEMBER_ID:
            self.member_id = ""
        if code in REJOIN_ERRORS:
            self.rejoin_needed = True

    # ------------------------------------------------------------ offsets

    def commit(self, offsets: dict[tuple[str, int], int], deadline: float) -> None:
        """Commit ``offsets`` (the next offset to read per partition) for this generation;
        CommitFailedError when the group moved on."""
        with self._lock:
            request = pb.OffsetCommitRequest(group_id=self.group_id,
                                             generation_id=self.generation,
                                             member_id=self.member_id)
        for (topic, partition), offset in sorted(offsets.items()):
            request.offsets.add(topic=topic, partition=partition, offset=offset,
                                leader_epoch=-1)
        answer: pb.OffsetCommitResponse = self.coordinator.retrying("OffsetCommit", request, deadline)
        codes = {o.error_code for o in answer.offsets} - {pb.NONE}
        for code in codes & REJOIN_ERRORS:
            self._on_group_error(code)
            raise CommitFailedError(f"commit refused ({pb.ErrorCode.Name(code)}): the group "
                                    "rebalanced; rejoining")
        if codes:
            raise error_for_code(min(codes), f"OffsetCommit of {self.group_id!r}")

    def committed(self, partitions: list[tuple[str, int]], deadline: float
                  ) -> dict[tuple[str, int], int]:
        """The committed offset of each partition (-1: none)."""
        request = pb.OffsetFetchRequest(group_id=self.group_id, partitions=[
            pb.GroupOffset(topic=t, partition=p) for t, p in partitions])
        answer: pb.OffsetFetchResponse = self.coordinator.retrying("OffsetFetch", request, deadline)
        if answer.error_code != pb.NONE:
            raise error_for_code(answer.error_code, f"OffsetFetch of {self.group_id!r}")
        return {(o.topic, o.partition): o.offset for o in answer.offsets}

    # ------------------------------------------------------------ leaving

    def close(self, leave: bool) -> None:
        self._stopped.set()
        if self._heartbeats is not None:
            self._heartbeats.join(self.coordinator.request_timeout_s + 1)
        if leave and self.member_id:
            self._leave()

    def _leave(self) -> None:
        with self._lock:
            member_id, self.member_id = self.member_id, ""
            self.generation = NO_GENERATION
        self.rejoin_needed = True
        if self.group_instance_id is not None:
            return  # static: its next join takes its place back (KIP-345)
        try:
            self.coordinator.call("LeaveGroup", pb.LeaveGroupRequest(group_id=self.group_id,
                                                                  member_ids=[member_id]))
        except (_CoordinatorGone, TidewaterError):
            pass  # the session timeout removes us instead


RebalanceCallback = Callable[[list[tuple[str, int]]], None]
