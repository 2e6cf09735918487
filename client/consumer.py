"""The consumer: manually assigned partitions, positions, and fetches from leaders.

Theory of operation: every assigned partition has a *position* (the next offset
to return) or none yet. ``poll`` first resolves missing positions with
``ListOffsets`` by the reset policy (earliest / latest / none), then sends one
``Fetch`` per leader broker for its partitions (concurrently; on the broker's
``FetchStream``, ``client.streams``), checks each batch's CRC, decodes it
straight into ConsumerRecord tuples (``proto.records.decode_consumer_records``)
and returns the records at or after each position, advancing it. Fetches carry the leader epoch from metadata
(KIP-320) so a stale leader answers FENCED_LEADER_EPOCH instead of data.

Transactions (``isolation_level``, Kafka's names): "read_uncommitted" (the
default) returns every data record below the high watermark; "read_committed"
asks the broker for records below the last stable offset only, with the
partition's aborted transactions, and drops the batches of each aborted
producer from the transaction's first offset until its ABORT marker (Kafka's
consumer algorithm); LATEST in a reset or ``seek_to_end`` is then the last
stable offset. Control batches (markers) are never returned.

Per-partition answers:

| answer                                   | action                                      |
|------------------------------------------|---------------------------------------------|
| NONE                                     | return records, advance the position        |
| NOT_LEADER_OR_FOLLOWER, FENCED_LEADER_EPOCH, UNKNOWN_TOPIC_OR_PARTITION, LEADER_NOT_AVAILABLE, transport error | refresh metadata, retry next poll |
| UNKNOWN_LEADER_EPOCH                     | the broker lags our metadata: retry later   |
| OFFSET_OUT_OF_RANGE                      | reset by policy; policy none raises         |
| anything else                            | raise the typed error                       |

A server without ``FetchStream`` (UNIMPLEMENTED: not a broker of this release)
is "anything else": ``poll`` raises the non-retriable ``UnsupportedVersionError``.

Prefetch: when a poll got records, the positions they lead to are known from
the batch headers alone, so the next Fetch (``max_wait_ms`` 0: it never
long-polls) is sent before the records are decoded; the broker reads the next
chunk while this one is decoded and handed out. It is sent only when some
partition's high watermark (in the answer) lies beyond the chunk: a caught-up
consumer would get an empty answer (a round trip of CPU on both sides for
every poll, ~0.2 ms here and ~0.4 ms in the broker) and its next poll
long-polls instead. The next poll uses that answer only if it asks for exactly
the same (partition, position, leader epoch) of the same brokers; after a seek,
an assignment change, a truncated poll (``max_records``) or an error it is
dropped. With one leader the poll waits for, its fetch is a ``_FollowingFetch``:
the loop thread that reads the answer sends that next fetch itself, before it
wakes the polling thread, as long as the poll is waiting for this very answer
(so at most one fetch runs ahead of the caller); the poll adopts it as its
prefetch or withdraws it, under the same rules.

Groups (``group_id``): ``subscribe`` lets the group's coordinator share the topics'
partitions among its members (``client.group``: join, sync, heartbeats; the leader
assigns with ``partition_assignment_strategy``, range or roundrobin, in
``client.assignors``). Each poll first rejoins when the group rebalances, or when a
subscribed topic has more partitions than at the last assignment (the metadata
snapshot is refreshed every ``metadata_max_age_ms``, as Kafka's consumer does): the
revoked partitions' positions are committed (with auto-commit), ``on_revoke`` and
``on_assign`` are called, and the new partitions start at their committed offsets
(``auto_offset_reset`` where none). ``commit`` commits the positions of what poll has
returned (the next offset to read), or given offsets; with ``enable_auto_commit``
poll does so every ``auto_commit_interval_ms``, and ``close`` once more before
leaving the group. Without ``subscribe`` the caller owns assignment and positions
(``assign``, ``seek``, ``position``); with a ``group_id`` it may still commit them
(a standalone member: generation -1).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from types import TracebackType

import grpc

from tidewater.client.group import CommitFailedError, GroupMembership, RebalanceCallback
from tidewater.client.metadata import (
    Address,
    BrokerConnectionError,
    LeaderInfo,
    MetadataClient,
    TopicPartition,
    client_metadata,
    format_address,
    rpc_error_to_typed,
)
from tidewater.client.streams import ClientStream, StreamPool, StreamRequest
from tidewater.client.transactions import ConsumerGroupMetadata
from tidewater.proto import tidewater_pb2 as pb
from tidewater.proto.batch import (
    HEADER_SIZE,
    TRANSACTIONAL_MASK,
    peek_batch_size,
    read_header,
    validate_batch,
)
from tidewater.proto.control_records import marker_of_batch
from tidewater.proto.errors import (
    CorruptRecordError,
    OffsetOutOfRangeError,
    TidewaterError,
    error_for_code,
)
from tidewater.proto.records import ConsumerRecord, decode_consumer_records

# ConsumerRecord, one record as poll returns it, is a NamedTuple (topic, partition,
# offset, key, value, timestamp, leader_epoch, headers) the decoder builds directly.
__all__ = ["CommitFailedError", "Consumer", "ConsumerRecord", "NoOffsetForPartitionError"]

EARLIEST_TIMESTAMP = -2
LATEST_TIMESTAMP = -1
RESET_POLICIES = ("earliest", "latest", "none")
ISOLATION_LEVELS = {"read_uncommitted": 0, "read_committed": 1}  # Kafka's numbers
# The loop thread follows an answer only up to this size: it serves every stream of the
# process, and a consumer catching up (MiB answers) leaves the next fetch to its poll.
FOLLOW_ANSWER_BYTES_MAX = 64 * 1024
FOLLOW_HANDOVER_WAIT_S = 5.0  # the loop never blocks while following; a dead loop ends it

# What a poll fetches from one leader: (partition, position, leader epoch) each.
FetchItems = tuple[tuple[TopicPartition, int, int], ...]
Wanted = dict[Address, FetchItems]  # what a poll fetches, by leader
PendingFetch = StreamRequest[pb.FetchRequest, pb.FetchResponse]
FetchCall = tuple[Address, FetchItems, PendingFetch]  # a fetch sent, as (address, items, call)
Prefetch = tuple[Wanted, list[FetchCall]]  # fetches sent ahead: what they ask, their calls
# One partition's records in an answer: (partition, records, high watermark, aborted
# transactions as (producer id, first offset), read_committed).
FetchChunk = tuple[TopicPartition, bytes, int, Sequence[tuple[int, int]]]
LeaderLookup = Callable[[TopicPartition], "LeaderInfo | None"]  # None: no leader known
# (topic, partition) pairs, as TopicPartition or plain tuples.
Partitions = Iterable[tuple[str, int]]


def _wait_done(call: PendingFetch, timeout_s: float, *, follow: bool = False) -> bool:
    """Whether a ``Consumer._send_fetch`` call is answered within ``timeout_s``; with
    ``follow``, a ``_FollowingFetch`` answered meanwhile sends the next fetch itself."""
    if follow and isinstance(call, _FollowingFetch):
        call.begin_wait()
        try:
            answered = call.wait(timeout_s)
        finally:
            claimed = call.end_wait()
        # Answered as the wait ended, and the loop thread took it to send the next fetch:
        # it wakes us right after, and the poll then sees the answer with its follow-up.
        return answered or (claimed and call.wait(FOLLOW_HANDOVER_WAIT_S))
    return call.wait(timeout_s)


class _FollowingFetch(StreamRequest[pb.FetchRequest, pb.FetchResponse]):
    """The fetch of a poll with one leader, on its FetchStream. When it is answered while
    its poll waits for it, the loop thread that read the answer sends the next fetch at
    once, on the same stream (``Consumer._follow``: what ``_prefetch`` would send after
    these records), and only then wakes the polling thread: no hand-off to that thread
    and back to the loop (a self-pipe write, a loop wake-up and a GIL exchange per round)
    before the next long-poll is out. The answer's records fields, read once there, go
    with it (``chunks``): each read of a protobuf bytes field is a fresh copy.

    The hand-over is decided under ``_handover``: the loop thread follows only if the
    poll still waits, and a poll whose wait ends just then learns that the loop took the
    answer (``end_wait``) and waits the moment it takes, so the poll always knows of
    the follow-up it must adopt or withdraw."""

    __slots__ = ("consumer", "items", "follow", "chunks", "_handover", "_waiting", "_claimed")

    def __init__(self, consumer: Consumer, items: FetchItems,
                 stream: ClientStream[pb.FetchRequest, pb.FetchResponse],
                 request: pb.FetchRequest) -> None:
        super().__init__(stream, request)
        self.consumer = consumer
        self.items = items
        self.follow: Prefetch | None = None  # (what it asks, its calls), once sent
        self.chunks: dict[TopicPartition, bytes] | None = None
        self._handover = threading.Lock()
        self._waiting = False  # a poll waits for this answer
        self._claimed = False  # the loop thread took the answer to follow it

    def begin_wait(self) -> None:
        with self._handover:
            self._waiting = True

    def end_wait(self) -> bool:
        """The poll stops waiting; True when the loop thread has taken the answer to
        follow it (it releases the waiter right after sending)."""
        with self._handover:
            self._waiting = False
            return self._claimed

    def on_answer(self, response: pb.FetchResponse | None, error: TidewaterError | None) -> None:
        with self._handover:
            claimed = self._claimed = error is None and self._waiting
        if claimed and response is not None:
            try:
                self.consumer._follow(self, response)
            except Exception:  # the poll then prefetches as usual
                self.follow = self.chunks = None
        super().on_answer(response, error)


class NoOffsetForPartitionError(OffsetOutOfRangeError):
    """Position out of range (or missing) and the reset policy is ``none``."""


class Consumer:
    def __init__(self, bootstrap: str, *, auto_offset_reset: str = "latest",
                 fetch_max_wait_ms: int = 500, fetch_min_bytes: int = 1,
                 fetch_max_bytes: int = 50 * 1024 * 1024,
                 max_partition_fetch_bytes: int = 1024 * 1024, request_timeout_ms: int = 30000,
                 retry_backoff_ms: int = 100, metadata: MetadataClient | None = None,
                 security_protocol: str = "PLAINTEXT", ssl_cafile: str | None = None,
                 ssl_certfile: str | None = None, ssl_keyfile: str | None = None,
                 sasl_mechanism: str | None = None, sasl_plain_username: str | None = None,
                 sasl_plain_password: str | None = None,
                 group_id: str | None = None, client_id: str = "tidewater-consumer",
                 enable_auto_commit: bool = True, auto_commit_interval_ms: int = 5000,
                 session_timeout_ms: int = 45000, heartbeat_interval_ms: int = 3000,
                 max_poll_interval_ms: int = 300000,
                 partition_assignment_strategy: str = "range",
                 metadata_max_age_ms: int = 30000, group_instance_id: str | None = None,
                 isolation_level: str = "read_uncommitted") -> None:
        if auto_offset_reset not in RESET_POLICIES:
            raise ValueError(f"auto_offset_reset must be one of {RESET_POLICIES}")
        if isolation_level not in ISOLATION_LEVELS:
            raise ValueError(f"isolation_level must be one of {tuple(ISOLATION_LEVELS)}")
        self.isolation_level = isolation_level
        self._isolation = ISOLATION_LEVELS[isolation_level]
        self.auto_offset_reset = auto_offset_reset
        self.fetch_max_wait_ms = fetch_max_wait_ms
        self.fetch_min_bytes = fetch_min_bytes
        self.fetch_max_bytes = fetch_max_bytes
        self.max_partition_fetch_bytes = max_partition_fetch_bytes
        self.request_timeout_ms = request_timeout_ms
        self.retry_backoff_ms = retry_backoff_ms
        # TLS settings (client/security.py, Kafka's names) for the streams and the
        # metadata client made here (a given ``metadata`` needs ``security=`` of its own).
        security, self.metadata = client_metadata(
            bootstrap, metadata, request_timeout_ms, security_protocol, ssl_cafile, ssl_certfile,
            ssl_keyfile, sasl_mechanism=sasl_mechanism, sasl_plain_username=sasl_plain_username,
            sasl_plain_password=sasl_plain_password, metadata_max_age_ms=metadata_max_age_ms)
        self._positions: dict[TopicPartition, int | None] = {}
        # Partitions whose position must be reset by timestamp (-2 earliest, -1 latest).
        self._pending_reset: dict[TopicPartition, int] = {}
        self._backoff_until: dict[TopicPartition, float] = {}
        # (what it asked for: leader address -> ((tp, position, epoch), ...), its calls)
        self._prefetched: Prefetch | None = None
        # Fetches go on one FetchStream per broker (client.streams).
        self.security = security  # for client.aio_consumer's streams
        self._streams: StreamPool[pb.FetchRequest, pb.FetchResponse] = StreamPool(
            "FetchStream", ordered=True, security=security)
        self._closed = False
        self.group: GroupMembership | None = None
        if group_id is not None:
            self.group = GroupMembership(
                self.metadata, group_id=group_id, client_id=client_id,
                session_timeout_ms=session_timeout_ms, rebalance_timeout_ms=max_poll_interval_ms,
                heartbeat_interval_ms=heartbeat_interval_ms,
                assignor=partition_assignment_strategy, request_timeout_ms=request_timeout_ms,
                retry_backoff_ms=retry_backoff_ms, group_instance_id=group_instance_id)
        self.enable_auto_commit = enable_auto_commit and group_id is not None
        self.auto_commit_interval_ms = auto_commit_interval_ms
        self._next_auto_commit = time.monotonic() + auto_commit_interval_ms / 1000
        self._subscription: list[str] = []
        # Partitions per subscribed topic when the group last assigned: a topic that
        # grows (or appears) since makes this member rejoin, as Kafka's consumers do.
        self._assigned_partition_counts: dict[str, int] = {}
        self._on_assign: RebalanceCallback | None = None
        self._on_revoke: RebalanceCallback | None = None

    # ------------------------------------------------------------------ groups

    def subscribe(self, topics: list[str], *, on_assign: RebalanceCallback | None = None,
                  on_revoke: RebalanceCallback | None = None) -> None:
        """Share ``topics``' partitions with the group's other members (needs ``group_id``).
        ``on_revoke(partitions)`` runs before a rebalance takes partitions away (after
        their positions were auto-committed), ``on_assign(partitions)`` after one gives
        them, both on the polling thread."""
        if self.group is None:
            raise ValueError("subscribe needs a group_id")
        self._subscription = sorted(set(topics))
        self._on_assign, self._on_revoke = on_assign, on_revoke
        self.metadata.add_topics(self._subscription)
        self.group.rejoin_needed = True

    def commit(self, offsets: Mapping[TopicPartition, int] | Mapping[tuple[str, int], int] | None = None
               ) -> None:
        """Commit ``offsets`` ({(topic, partition): next offset}), by default the position
        of every assigned partition poll has returned records of or positioned;
        CommitFailedError when the group has rebalanced meanwhile."""
        if self.group is None:
            raise ValueError("commit needs a group_id")
        if offsets is None:
            offsets = {tp: pos for tp, pos in self._positions.items()
                       if pos is not None and tp not in self._pending_reset}
        if offsets:
            self.group.commit({(topic, partition): off for (topic, partition), off in offsets.items()},
                              time.monotonic() + self.request_timeout_ms / 1000)

    def group_metadata(self) -> ConsumerGroupMetadata:
        """This member's group, generation and member id, for a transactional producer's
        ``send_offsets_to_transaction`` (the coordinator refuses offsets of a member the
        group has moved past: a zombie's, KIP-447)."""
        if self.group is None:
            raise RuntimeError("group_metadata needs a consumer with a group_id")
        return ConsumerGroupMetadata(self.group.group_id, self.group.generation,
                                     self.group.member_id, self.group.group_instance_id)

    def committed(self, tps: Partitions) -> dict[TopicPartition, int]:
        """The group's committed offset of each partition (-1: none)."""
        if self.group is None:
            raise ValueError("committed needs a group_id")
        found = self.group.committed([(topic, partition) for topic, partition in tps],
                                     time.monotonic() + self.request_timeout_ms / 1000)
        return {TopicPartition(*tp): off for tp, off in found.items()}

    def _partition_counts(self, *, fresh: bool = False) -> dict[str, int]:
        """Partitions of each subscribed topic that exists, from the metadata snapshot:
        on every poll never blocking (an aged snapshot is refreshed in the background,
        metadata_max_age_ms; a topic missing from a stale one is left out); ``fresh``
        (after an assignment) waits for a current snapshot."""
        counts: dict[str, int] = {}
        for topic in self._subscription:
            if fresh:
                try:
                    counts[topic] = len(self.metadata.partitions_for(topic))
                except TidewaterError:
                    pass  # not there (yet): its creation will count as growth
                continue
            partitions = self.metadata.cached_partitions(topic)
            if partitions:
                counts[topic] = len(partitions)
        return counts

    def rebalance_due(self) -> bool:
        """Whether this member must (re)join its group before it fetches: the group
        rebalances, or a subscribed topic has more partitions than at the last
        assignment. Never blocks (the metadata snapshot as it is)."""
        group = self.group
        if group is None or not self._subscription:
            return False
        if not group.rejoin_needed:
            counts = self._partition_counts()
            if all(self._assigned_partition_counts.get(t) == n for t, n in counts.items()):
                return False
            group.rejoin_needed = True  # partitions were added: share them out again
        return True

    def _maybe_rebalance(self, deadline: float) -> None:
        if self.rebalance_due():
            self.rebalance(deadline)

    def rebalance(self, deadline: float) -> None:
        """Give the assigned partitions back (auto-commit, ``on_revoke``), join and sync,
        and take the new assignment at its committed offsets (``on_assign``). Blocks."""
        group = self.group
        assert group is not None
        revoked = sorted(self._positions)
        if revoked:
            self._maybe_commit_quietly()
            if self._on_revoke is not None:
                self._on_revoke([(tp.topic, tp.partition) for tp in revoked])
        assignment = group.ensure_active(self._subscription, deadline)
        if assignment is None:
            if revoked:
                self.assign([])  # the old partitions may be another member's already
            return
        self._assigned_partition_counts = self._partition_counts(fresh=True)
        self.assign(assignment)
        self._positions = dict.fromkeys(self._positions)
        if assignment:
            for tp, offset in self.committed(assignment).items():
                if offset >= 0:
                    self.seek(tp, offset)
        if self._on_assign is not None:
            self._on_assign(sorted(assignment))

    def _maybe_commit_quietly(self) -> None:
        """Auto-commit: a refused commit is not the caller's error (records are
        redelivered to the partition's next owner: at least once)."""
        if not self.enable_auto_commit:
            return
        try:
            self.commit()
        except TidewaterError:
            pass
        self._next_auto_commit = time.monotonic() + self.auto_commit_interval_ms / 1000

    def auto_commit_due(self) -> bool:
        return self.enable_auto_commit and time.monotonic() >= self._next_auto_commit

    def maybe_auto_commit(self) -> None:
        if self.auto_commit_due():
            self._maybe_commit_quietly()

    # ------------------------------------------------------------------ assignment & positions

    def assign(self, partitions: Partitions) -> None:
        """Consume exactly these (topic, partition) pairs; positions of kept ones survive."""
        tps = [TopicPartition(t, p) for t, p in partitions]
        self._positions = {tp: self._positions.get(tp) for tp in tps}
        self._pending_reset = {tp: ts for tp, ts in self._pending_reset.items() if tp in self._positions}
        self.metadata.add_topics({tp.topic for tp in tps})

    def assignment(self) -> list[TopicPartition]:
        return list(self._positions)

    def partitions_for(self, topic: str) -> list[int]:
        """Partition numbers of ``topic`` (raises UnknownTopicOrPartitionError)."""
        return sorted(self.metadata.partitions_for(topic))

    def seek(self, partition: tuple[str, int], offset: int) -> None:
        tp = self._assigned(partition)
        if offset < 0:
            raise ValueError("offset must be >= 0")
        self._positions[tp] = offset
        self._pending_reset.pop(tp, None)

    def seek_to_beginning(self, tps: Partitions | None = None) -> None:
        for tp in tps or list(self._positions):
            self._pending_reset[self._assigned(tp)] = EARLIEST_TIMESTAMP

    def seek_to_end(self, tps: Partitions | None = None) -> None:
        for tp in tps or list(self._positions):
            self._pending_reset[self._assigned(tp)] = LATEST_TIMESTAMP

    def position(self, partition: tuple[str, int]) -> int:
        """The next offset ``poll`` returns for ``partition`` (resolving a pending reset now)."""
        tp = self._assigned(partition)
        deadline = time.monotonic() + self.request_timeout_ms / 1000
        while True:
            self.resolve_positions(deadline)
            pos = self._positions[tp]
            if pos is not None and tp not in self._pending_reset:
                return pos
            if time.monotonic() >= deadline:
                raise BrokerConnectionError(
                    f"no position for {tp.topic}-{tp.partition} within {self.request_timeout_ms} ms "
                    "(no leader answered ListOffsets)")
            time.sleep(self.retry_backoff_ms / 1000)

    def beginning_offsets(self, tps: Partitions) -> dict[TopicPartition, int]:
        return self._list_offsets([TopicPartition(*tp) for tp in tps], EARLIEST_TIMESTAMP)

    def end_offsets(self, tps: Partitions) -> dict[TopicPartition, int]:
        """High watermark of each partition (the next offset a consumer could read; the
        last stable offset with read_committed)."""
        return self._list_offsets([TopicPartition(*tp) for tp in tps], LATEST_TIMESTAMP)

    def offsets_for_times(self, tps: Partitions, timestamp_ms: int) -> dict[TopicPartition, int]:
        """The first offset whose record's timestamp is >= ``timestamp_ms`` (-1: none)."""
        return self._list_offsets([TopicPartition(*tp) for tp in tps], timestamp_ms)

    def _assigned(self, partition: tuple[str, int]) -> TopicPartition:
        tp = TopicPartition(*partition)
        if tp not in self._positions:
            raise ValueError(f"{tp.topic}-{tp.partition} is not assigned")
        return tp

    # ------------------------------------------------------------------ poll

    def poll(self, timeout_ms: int = 1000, max_records: int | None = None) -> list[ConsumerRecord]:
        """Records fetched within ``timeout_ms`` (empty when none arrived)."""
        if self._closed:
            raise RuntimeError("consumer is closed")
        deadline = time.monotonic() + timeout_ms / 1000
        if self.group is not None:
            self.group.last_poll_s = time.monotonic()
        self.maybe_auto_commit()
        while True:
            self._maybe_rebalance(deadline)
            self.resolve_positions(deadline)
            records = self._fetch_once(deadline, max_records)
            if records or time.monotonic() >= deadline:
                return records

    def needs_positions(self) -> bool:
        """Whether some assigned partition has no position yet or a reset pending."""
        return bool(self._pending_reset) or any(pos is None for pos in self._positions.values())

    def resolve_positions(self, deadline: float) -> None:
        """Positions for the partitions without one or with a reset pending (ListOffsets
        at their leaders, blocking); a retriable failure leaves them for the next poll."""
        needing = {tp: self._pending_reset.get(tp, self._reset_timestamp(tp))
                   for tp, pos in self._positions.items()
                   if pos is None or tp in self._pending_reset}
        if not needing:
            return
        by_ts: dict[int, list[TopicPartition]] = {}
        for tp, ts in needing.items():
            by_ts.setdefault(ts, []).append(tp)
        for ts, tps in by_ts.items():
            try:
                offsets = self._list_offsets(tps, ts)
            except TidewaterError as e:
                if not e.retriable:
                    raise
                self.metadata.invalidate()
                continue
            for tp, offset in offsets.items():
                self._positions[tp] = offset
                self._pending_reset.pop(tp, None)

    def _reset_timestamp(self, tp: TopicPartition) -> int:
        if self.auto_offset_reset == "none":
            raise NoOffsetForPartitionError(f"no position for {tp.topic}-{tp.partition} and reset policy is none")
        return EARLIEST_TIMESTAMP if self.auto_offset_reset == "earliest" else LATEST_TIMESTAMP

    def _list_offsets(self, tps: list[TopicPartition], timestamp: int) -> dict[TopicPartition, int]:
        """ListOffsets at each partition's leader; partitions without a leader are left out."""
        by_leader: dict[Address, list[tuple[TopicPartition, int]]] = {}
        for tp in tps:
            leader = self.metadata.leader_for(tp)
            if leader is None:
                self.metadata.invalidate()
                continue
            by_leader.setdefault(leader.address, []).append((tp, leader.leader_epoch))
        out: dict[TopicPartition, int] = {}
        for address, items in by_leader.items():
            request = pb.ListOffsetsRequest(replica_id=-1, isolation_level=self._isolation,
                                            partitions=[
                pb.ListOffsetsPartition(topic=tp.topic, partition=tp.partition,
                                        current_leader_epoch=epoch, timestamp=timestamp)
                for tp, epoch in items])
            try:
                resp: pb.ListOffsetsResponse = self.metadata.pool.broker(address).ListOffsets(
                    request, timeout=self.request_timeout_ms / 1000)
            except grpc.RpcError as e:
                self.metadata.invalidate()
                raise rpc_error_to_typed(e, address) from None
            for p in resp.partitions:
                tp = TopicPartition(p.topic, p.partition)
                if p.error_code == pb.NONE:
                    out[tp] = p.offset
                    continue
                err = error_for_code(p.error_code, f"ListOffsets {p.topic}-{p.partition}: "
                                     f"{pb.ErrorCode.Name(p.error_code)}")
                if not err.retriable:
                    raise err
                if err.invalid_metadata:
                    self.metadata.invalidate()
        return out

    def _fetch_once(self, deadline: float, max_records: int | None) -> list[ConsumerRecord]:
        now = time.monotonic()
        wanted = self.fetch_plan(self.fetchable(now), self.leader_or_none)
        if not wanted:
            time.sleep(self.idle_wait_s(deadline))
            return []
        wait_ms = self.fetch_wait_ms(deadline, now)
        prefetched, self._prefetched = self._prefetched, None
        if prefetched is not None and prefetched[0] == wanted:
            calls = prefetched[1]
            follow = max_records is None  # a truncated poll withdraws a prefetch anyway
            try:
                answered = all(_wait_done(call, deadline - time.monotonic(), follow=follow)
                               for _, _, call in calls)
            except BaseException:  # e.g. KeyboardInterrupt: withdraw what is out, as below
                self._cancel(calls)
                raise
            if not answered:
                self._prefetched = prefetched  # a long-poll still waiting: the next poll takes it
                return []
        else:
            if prefetched is not None:
                self._cancel(prefetched[1])
            calls = self._send_fetches(wanted, wait_ms)
        chunks: list[FetchChunk] = []
        clean = True  # every partition answered without an error
        try:
            for _address, items, call in calls:
                answer: pb.FetchResponse | TidewaterError | None
                try:
                    answer = call.result()
                except TidewaterError as e:  # a transport failure
                    answer = e
                assert answer is not None  # a fetch is answered (or fails)
                leader_chunks, leader_clean = self.read_fetch_answer(
                    items, answer, call.chunks if isinstance(call, _FollowingFetch) else None)
                chunks += leader_chunks
                clean = clean and leader_clean
        except BaseException:
            # Calls not read yet are withdrawn: a long-poll left on an ordered stream would
            # hold the next poll's fetch behind it.
            self._cancel(calls)
            raise
        followed = calls[0][2].follow if isinstance(calls[0][2], _FollowingFetch) else None
        if chunks and clean and max_records is None:
            if followed is not None:
                self._prefetched = followed  # sent by the loop thread: what _prefetch would send
            else:
                self._prefetch(wanted, {tp: data for tp, data, _, _ in chunks},
                               {tp: high_watermark for tp, _, high_watermark, _ in chunks})
        elif followed is not None:
            self._cancel(followed[1])
        records = self.decode_chunks(chunks, max_records)
        if max_records is not None and len(records) > max_records:
            # Hand back only max_records; rewind positions so the rest come next poll.
            kept = records[:max_records]
            for rec in records[max_records:]:
                tp = TopicPartition(rec.topic, rec.partition)
                pos = self._positions.get(tp)
                if pos is not None and rec.offset < pos:
                    self._positions[tp] = rec.offset
            return kept
        return records

    # -------------------------------------------- fetch rounds (shared with client.aio_consumer)

    def fetchable(self, now: float) -> list[tuple[TopicPartition, int]]:
        """The assigned partitions to fetch at ``now``, with their positions: those
        positioned and not backing off after an error."""
        backoff_until = self._backoff_until
        return [(tp, pos) for tp, pos in self._positions.items()
                if pos is not None and backoff_until.get(tp, 0) <= now]

    def leader_or_none(self, tp: TopicPartition) -> LeaderInfo | None:
        """``tp``'s leader, refreshing metadata when the snapshot is stale (blocking);
        None when it has none or a retriable error hides it."""
        try:
            return self.metadata.leader_for(tp)
        except TidewaterError as e:
            if not e.retriable:
                raise
            return None

    def fetch_plan(self, fetchable: Iterable[tuple[TopicPartition, int]],
                   leader_of: LeaderLookup) -> Wanted:
        """``fetchable`` (``fetchable()``) grouped by the address of each partition's
        leader (``leader_of``); a partition without a known leader is left out: metadata
        is invalidated and the partition backs off."""
        by_leader: dict[Address, list[tuple[TopicPartition, int, int]]] = {}
        for tp, pos in fetchable:
            leader = leader_of(tp)
            if leader is None:
                self.metadata.invalidate()
                self._backoff(tp)
                continue
            by_leader.setdefault(leader.address, []).append((tp, pos, leader.leader_epoch))
        return {address: tuple(items) for address, items in by_leader.items()}

    def fetch_wait_ms(self, deadline: float, now: float) -> int:
        """A fetch's long-poll: ``fetch_max_wait_ms``, or what is left of the poll."""
        return int(max(0, min(self.fetch_max_wait_ms, (deadline - now) * 1000)))

    def idle_wait_s(self, deadline: float) -> float:
        """How long a poll with nothing to fetch (every partition backing off or
        leaderless) waits before it looks again."""
        return max(0.0, min(self.retry_backoff_ms / 1000, deadline - time.monotonic()))

    def read_fetch_answer(self, items: FetchItems, answer: pb.FetchResponse | TidewaterError,
                          loop_chunks: Mapping[TopicPartition, bytes] | None = None
                          ) -> tuple[list[FetchChunk], bool]:
        """One leader's answer to the fetch of ``items`` (or its transport error) by the
        answer table (module docstring): errors go to ``_on_partition_error``, which
        raises those not retriable; partitions unassigned while the fetch was out are
        skipped. Returns the partitions' records and whether the answer was clean (no
        error). ``loop_chunks``: the records fields the loop thread read already
        (``_FollowingFetch.chunks``)."""
        if isinstance(answer, TidewaterError):
            self._on_partition_error([tp for tp, _, _ in items], answer)
            return [], False
        if answer.error_code != pb.NONE:
            self._on_partition_error([tp for tp, _, _ in items], error_for_code(answer.error_code))
            return [], False
        chunks: list[FetchChunk] = []
        clean = True
        for p in answer.partitions:
            tp = TopicPartition(p.topic, p.partition)
            if tp not in self._positions:
                continue
            if p.error_code != pb.NONE:
                clean = False
                self._on_partition_error([tp], error_for_code(
                    p.error_code, p.error_message or pb.ErrorCode.Name(p.error_code)))
                continue
            # Each read of a protobuf bytes field is a fresh copy: the loop's if it read one.
            data = p.records if loop_chunks is None else loop_chunks.get(tp, b"")
            if data:
                aborted = ([(a.producer_id, a.first_offset) for a in p.aborted_transactions]
                           if p.aborted_transactions else ())
                chunks.append((tp, data, p.high_watermark, aborted))
        return chunks, clean

    def decode_chunks(self, chunks: Iterable[FetchChunk],
                      max_records: int | None = None) -> list[ConsumerRecord]:
        """The records of ``chunks``, advancing positions; with ``max_records``, batches
        past the limit are left undecoded (fetched again; up to a batch more is returned)."""
        records: list[ConsumerRecord] = []
        for tp, data, _high_watermark, aborted in chunks:
            records += self._decode(tp, data, None if max_records is None else max_records - len(records),
                                    aborted)
        return records

    def fetch_request(self, items: FetchItems, wait_ms: int) -> pb.FetchRequest:
        return pb.FetchRequest(
            replica_id=-1, replica_broker_epoch=-1, max_wait_ms=wait_ms,
            min_bytes=self.fetch_min_bytes, max_bytes=self.fetch_max_bytes,
            isolation_level=self._isolation,
            partitions=[pb.FetchPartition(
                topic=tp.topic, partition=tp.partition, current_leader_epoch=epoch,
                fetch_offset=pos, last_fetched_epoch=-1, log_start_offset=-1,
                partition_max_bytes=self.max_partition_fetch_bytes)
                for tp, pos, epoch in items])

    def fetch_timeout_s(self, wait_ms: int) -> float:
        """A fetch's deadline: its long-poll and ``request_timeout_ms``."""
        return wait_ms / 1000 + self.request_timeout_ms / 1000

    def _send_fetches(self, wanted: Wanted, wait_ms: int) -> list[FetchCall]:
        """One Fetch per leader address, sent now; [(address, items, call)]."""
        calls: list[FetchCall] = []
        for address, items in wanted.items():
            calls.append((address, items, self._send_fetch(
                address, self.fetch_request(items, wait_ms), items if len(wanted) == 1 else None)))
        return calls

    def _send_fetch(self, address: Address, request: pb.FetchRequest,
                    items: FetchItems | None = None) -> PendingFetch:
        """On the broker's FetchStream (a StreamRequest; a ``_FollowingFetch`` given the
        request's ``items``, the poll's only leader): its ``result`` waits for the answer.
        Not ``StreamPool.send``: the pending request holds its stream before it is sent
        (the loop thread may answer it at once)."""
        for _ in range(2):  # a stream found broken between lookup and send: open a new one
            stream = self._streams.stream(address)
            if stream is None:
                break  # the pool is closed: the consumer is closing
            pending: PendingFetch = (StreamRequest(stream, request) if items is None
                       else _FollowingFetch(self, items, stream, request))
            if stream.send(request, pending.on_answer, self.fetch_timeout_s(request.max_wait_ms)):
                return pending
        # No stream to send on: the request fails as a transport failure would (retried by
        # the next poll); answered already, so it never touches its (absent) stream.
        failed: PendingFetch = StreamRequest(None, request)
        failed.on_answer(None, BrokerConnectionError(
            f"no FetchStream to {format_address(address)} to send on"))
        return failed

    def _prefetch(self, wanted: Wanted, chunks: dict[TopicPartition, bytes],
                  high_watermarks: dict[TopicPartition, int]) -> None:
        """Send the fetches the next poll will make once ``chunks`` are decoded, as Kafka's
        consumer does: with no wait if some partition has more records than its chunk
        held, else a long-poll, so that the broker holds a fetch when the next records
        are committed instead of waiting for this one's records to be handed over and
        the next poll to ask (a thread hand-off and a request on the way). The
        long-poll only when the partitions have one leader (see below)."""
        following, behind = self._following(wanted, chunks, high_watermarks)
        if behind:
            wait_ms = 0
        elif len(following) == 1:
            wait_ms = self.fetch_max_wait_ms
        else:
            # Several leaders: a poll would wait for every long-poll and hold one leader's
            # records while another's waits; the next poll asks, with its own timeout.
            return
        self._prefetched = (following, self._send_fetches(following, wait_ms))

    def _following(self, wanted: Wanted, chunks: dict[TopicPartition, bytes],
                   high_watermarks: dict[TopicPartition, int]) -> tuple[Wanted, bool]:
        """What the next poll will ask once ``chunks`` are decoded, and whether some
        partition has more records than its chunk held."""
        behind = False
        following: Wanted = {}
        for address, items in wanted.items():
            after = []
            for tp, pos, epoch in items:
                if tp in chunks:
                    pos = self._position_after(pos, chunks[tp])
                    behind = behind or pos < high_watermarks[tp]
                after.append((tp, pos, epoch))
            following[address] = tuple(after)
        return following, behind

    def _follow(self, call: _FollowingFetch, response: pb.FetchResponse) -> None:
        """On the loop thread, for a clean answer with records to ``call`` (a poll's only
        leader), up to ``FOLLOW_ANSWER_BYTES_MAX``: send the fetch ``_prefetch`` would send
        after it on the same stream (``call.follow``; none if the stream broke meanwhile,
        e.g. the poll withdrew a long-poll) and keep the records fields read
        (``call.chunks``)."""
        if (self._closed or response.error_code != pb.NONE
                or response.ByteSize() > FOLLOW_ANSWER_BYTES_MAX):
            return
        chunks: dict[TopicPartition, bytes] = {}
        high_watermarks: dict[TopicPartition, int] = {}
        for p in response.partitions:
            if p.error_code != pb.NONE:
                return
            data = p.records
            if data:
                tp = TopicPartition(p.topic, p.partition)
                chunks[tp] = data
                high_watermarks[tp] = p.high_watermark
        call.chunks = chunks
        if not chunks:
            return
        stream = call.stream
        if stream is None:
            return  # (a _FollowingFetch always has its stream)
        following, behind = self._following({stream.address: call.items}, chunks, high_watermarks)
        items = following[stream.address]
        request = self.fetch_request(items, 0 if behind else self.fetch_max_wait_ms)
        pending = _FollowingFetch(self, items, stream, request)
        if stream.send(request, pending.on_answer, self.fetch_timeout_s(request.max_wait_ms)):
            call.follow = (following, [(stream.address, items, pending)])

    @staticmethod
    def _position_after(position: int, data: bytes) -> int:
        """The position ``_decode`` leaves after ``data``, from the batch headers alone (a
        corrupt batch makes ``_decode`` raise instead, and the prefetch then goes unused)."""
        batch_pos = 0
        while True:
            size = peek_batch_size(data, batch_pos)
            if size is None or size < HEADER_SIZE or batch_pos + size > len(data):
                return position
            position = max(position, read_header(data, batch_pos).next_offset)
            batch_pos += size

    @staticmethod
    def _cancel(calls: list[FetchCall]) -> None:
        for _address, _items, call in calls:
            if isinstance(call, _FollowingFetch) and call.follow is not None:
                Consumer._cancel(call.follow[1])  # sent by the loop after this answer
            if (isinstance(call, StreamRequest) and call.request.max_wait_ms and not call.done()
                    and call.stream is not None):
                # A long-poll not wanted any more (a seek, a new assignment) would hold
                # the stream's next answers for up to fetch_max_wait_ms: a new stream instead.
                call.stream.abort(BrokerConnectionError("long-poll fetch withdrawn"))
            call.cancel()

    def _decode(self, tp: TopicPartition, data: bytes, limit: int | None = None,
                aborted_transactions: Iterable[tuple[int, int]] = ()) -> list[ConsumerRecord]:
        """Records of ``data`` at or after ``tp``'s position, which moves past them; with
        ``limit``, decoding stops at the first batch boundary with ``limit`` records.
        ``aborted_transactions`` (read_committed): (producer id, first offset) of the
        aborted transactions the answer overlaps; their batches are skipped."""
        # Kafka's consumer: a producer is aborted from its transaction's first offset
        # (once a batch reaches it) until its ABORT marker.
        pending_aborts = sorted(aborted_transactions, key=lambda a: a[1])
        aborted_producers: set[int] = set()
        position = self._positions[tp]
        assert position is not None  # fetched from there
        out: list[ConsumerRecord] = []
        topic, partition = tp
        batch_pos = 0
        while limit is None or len(out) < limit:
            size = peek_batch_size(data, batch_pos)
            if size is None or batch_pos + size > len(data):
                break  # a partial batch at the end (fetch size limit): fetched again next time
            if size < HEADER_SIZE:
                raise CorruptRecordError(f"batch of {size} bytes in fetch of {tp.topic}-{tp.partition}",
                                         position=batch_pos)
            start = batch_pos
            batch_pos += size
            if read_header(data, start).next_offset <= position:
                continue  # already returned (a fetch starts at the batch holding the position)
            header = validate_batch(data, start)  # framing, magic, CRC
            while pending_aborts and pending_aborts[0][1] <= header.last_offset:
                aborted_producers.add(pending_aborts.pop(0)[0])
            if header.is_control:
                if header.producer_id in aborted_producers:
                    marker = marker_of_batch(data, start, header)
                    if marker is not None and not marker.committed:
                        aborted_producers.discard(header.producer_id)
                position = header.next_offset
                continue
            if (header.attributes & TRANSACTIONAL_MASK
                    and header.producer_id in aborted_producers):
                position = max(position, header.next_offset)
                continue
            records = decode_consumer_records(data, start, header, topic, partition)
            if header.base_offset < position:  # only the batch holding the position
                records = [r for r in records if r.offset >= position]
            out += records
            position = max(position, header.next_offset)
        self._positions[tp] = position
        return out

    def _on_partition_error(self, tps: list[TopicPartition], error: TidewaterError) -> None:
        if isinstance(error, OffsetOutOfRangeError):
            for tp in tps:
                if self.auto_offset_reset == "none":
                    raise NoOffsetForPartitionError(
                        f"offset {self._positions.get(tp)} out of range for {tp.topic}-{tp.partition}")
                self._pending_reset[tp] = self._reset_timestamp(tp)
            return
        if not error.retriable:
            raise error
        if error.invalid_metadata:
            self.metadata.invalidate()
        for tp in tps:
            self._backoff(tp)

    def _backoff(self, tp: TopicPartition) -> None:
        self._backoff_until[tp] = time.monotonic() + self.retry_backoff_ms / 1000

    def close(self) -> None:
        if not self._closed:
            if self.group is not None:
                if self._subscription and not self.group.rejoin_needed:
                    self._maybe_commit_quietly()
                self.group.close(leave=bool(self._subscription))
            self._closed = True
            if self._prefetched is not None:
                self._cancel(self._prefetched[1])
                self._prefetched = None
            self._streams.close()
            self.metadata.close()

    def __enter__(self) -> Consumer:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()


OffsetsFetch = Callable[[list[TopicPartition]], dict[TopicPartition, int]]


def offsets_of_every(fetch: OffsetsFetch, tps: list[TopicPartition], deadline: float,
                     backoff_s: float) -> tuple[dict[TopicPartition, int], list[TopicPartition]]:
    """``fetch`` (``Consumer.beginning_offsets``, ``end_offsets`` ...: each leaves out the
    partitions with no known leader or a retriable error code) asked again for those it
    left out, every ``backoff_s``, until none is left or ``deadline`` (``time.monotonic``)
    has passed: (the offsets found, the partitions still without one)."""
    found: dict[TopicPartition, int] = {}
    missing = list(tps)
    while True:
        found.update(fetch(missing))
        missing = [tp for tp in missing if tp not in found]
        if not missing or time.monotonic() >= deadline:
            return found, missing
        time.sleep(backoff_s)
