"""Fetch sessions (KIP-227): the broker's side, as Kafka's ``FetchSession.scala``.

Theory of operation
-------------------
A consumer of many partitions sends the same partition list on every poll. With a
session the broker remembers that list, and the client sends only what changed:

- Every Fetch v7+ carries ``(session_id, session_epoch)`` (Kafka's ``FetchMetadata``).
  Epoch 0 (INITIAL) asks for a *full* fetch that opens a new session; epoch -1 (FINAL)
  asks for a full fetch without one (sessionless, as before v7). A full fetch naming a
  session id closes that session.
- A full fetch that opens a session is answered with its new id (0 when the cache is
  full and nothing may be evicted: the client then keeps sending full fetches). The
  session's next expected epoch is 1.
- An *incremental* fetch (id != 0, epoch > 0) names the session and the epoch it expects.
  Its partitions are added to the session or update the cached ones (fetch offset,
  max bytes, epochs); ``forgotten_topics_data`` removes partitions. The broker reads every
  partition of the session, and answers only those with something new: records, a
  changed high watermark or log start offset, an error, a diverging epoch. A partition
  that returned records moves to the end of the session's order, so that a fetch's
  ``max_bytes`` is shared round-robin (Kafka's fairness rule).
- An unknown id is FETCH_SESSION_ID_NOT_FOUND (70), a wrong epoch
  INVALID_FETCH_SESSION_EPOCH (71), a session opened with topic ids (v13+) used by an
  older version or the other way round FETCH_SESSION_TOPIC_ID_ERROR (106): the client
  then starts over with a full fetch. An incremental fetch that leaves the session empty
  closes it and is answered sessionless.

Cache limits and eviction (Kafka's ``FetchSessionCache``)
---------------------------------------------------------
At most ``max.incremental.fetch.session.cache.slots`` sessions (default 1000). A new
session when the cache is full may evict:

1. the least recently used session, if it was unused for more than
   ``min.incremental.fetch.session.eviction.ms`` (default 120000);
2. otherwise the least valuable evictable session, if the new one is worth at least as
   much. Value orders by (privileged, number of partitions, id): follower sessions
   (privileged) over consumer sessions, larger over smaller. A session is evictable by a
   consumer only once it is older than the eviction time; a privileged asker may also
   evict any unprivileged session. Evictability is recomputed when a session is
   touched, as Kafka's (a session untouched since its creation stays protected until it
   goes stale by rule 1).

Followers replicate over gRPC here, so the Kafka listener opens only unprivileged
sessions; the rule is kept whole so it reads as Kafka's.

Nothing here does I/O or reads a clock: time comes in as ``now_ms``; the Fetch handler
(``apis.on_fetch``) reads the partitions a context names and hands the results back.
"""

from __future__ import annotations

import random
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from tidewater.broker.metrics import FetchSessionView
from tidewater.proto import tidewater_pb2 as pb
from tidewater.proto.errors import (
    FetchSessionIdNotFoundError,
    FetchSessionTopicIdError,
    InvalidFetchSessionEpochError,
    InvariantViolation,
)

INVALID_SESSION_ID = 0
INITIAL_EPOCH = 0  # a full fetch that opens a session
FINAL_EPOCH = -1  # a full fetch without a session (or closing the one named)
SESSION_ID_MAX = 2**31 - 1  # an int32 on the wire, positive
CACHE_SLOTS_DEFAULT = 1000  # max.incremental.fetch.session.cache.slots
EVICTION_MS_MIN_DEFAULT = 120_000  # min.incremental.fetch.session.eviction.ms
INVALID_HIGH_WATERMARK = -1  # a cached partition not answered yet (or last with an error)


def next_epoch(epoch: int) -> int:
    """Kafka's ``FetchMetadata.nextEpoch``: INITIAL -> 1, FINAL stays, wraps to 1."""
    if epoch < 0:
        return FINAL_EPOCH
    return 1 if epoch == 2**31 - 1 else epoch + 1


# A partition in a session: (topic, partition). The topic is the name for Fetch v7-12 and
# the topic id (its ``uuid.UUID`` string) for v13+, as Kafka keys sessions by
# TopicIdPartition from v13 on.
PartitionKey = tuple[str, int]


@dataclass(frozen=True, slots=True)
class PartitionFetch:
    """What a request asks of one partition (the fields a session caches)."""

    fetch_offset: int
    partition_max_bytes: int
    current_leader_epoch: int = -1
    last_fetched_epoch: int = -1
    log_start_offset: int = -1  # the fetcher's own (followers); -1 from consumers


@dataclass(frozen=True, slots=True)
class PartitionOutcome:
    """What the read of one partition answered: what decides whether an incremental
    fetch's response lists it."""

    key: PartitionKey
    error_code: int
    high_watermark: int
    log_start_offset: int
    records_bytes: int
    diverging: bool = False
    preferred_read_replica: int = -1
    last_stable_offset: int = -1  # a consumer's answer; -1 where there is none


@dataclass(slots=True)
class _CachedPartition:
    request: PartitionFetch
    # What the client was last told; a change is answered on the next incremental fetch.
    high_watermark: int = INVALID_HIGH_WATERMARK
    log_start_offset: int = -1
    last_stable_offset: int = -1

    def must_respond(self, outcome: PartitionOutcome) -> bool:
        """Kafka's ``CachedPartition.maybeUpdateResponseData``: whether the incremental
        response lists this partition, updating what the client is known to have seen."""
        respond = outcome.records_bytes > 0 or outcome.diverging
        respond = respond or outcome.preferred_read_replica >= 0
        if self.high_watermark != outcome.high_watermark:
            respond = True
            self.high_watermark = outcome.high_watermark
        if self.log_start_offset != outcome.log_start_offset:
            respond = True
            self.log_start_offset = outcome.log_start_offset
        if self.last_stable_offset != outcome.last_stable_offset:
            respond = True  # a transaction ended: read_committed may read further
            self.last_stable_offset = outcome.last_stable_offset
        if outcome.error_code != pb.NONE:
            # Forget the high watermark: once the error is gone, the partition is answered
            # again even if its high watermark did not move meanwhile.
            self.high_watermark = INVALID_HIGH_WATERMARK
            respond = True
        return respond


@dataclass(eq=False, slots=True)
class FetchSession:
    """One client's session: its partitions in fetch order and the epoch it expects next."""

    session_id: int
    privileged: bool
    uses_topic_ids: bool
    created_ms: int
    last_used_ms: int
    epoch: int
    partitions: OrderedDict[PartitionKey, _CachedPartition] = field(default_factory=OrderedDict)
    # The size the eviction indexes last saw (Kafka's cachedSize); -1: not indexed yet.
    indexed_size: int = -1

    @property
    def size(self) -> int:
        return len(self.partitions)

    def evictable_key(self, size: int) -> tuple[bool, int, int]:
        """Kafka's EvictableKey: a session with a smaller key is evicted first."""
        return (self.privileged, size, self.session_id)

    def update(self, wanted: Mapping[PartitionKey, PartitionFetch],
               forgotten: Iterable[PartitionKey]) -> None:
        for key, request in wanted.items():
            cached = self.partitions.get(key)
            if cached is None:
                self.partitions[key] = _CachedPartition(request)
            else:
                cached.request = request
        for key in forgotten:
            self.partitions.pop(key, None)


@dataclass(frozen=True, slots=True)
class FullFetch:
    """A full fetch: read ``partitions``; then ``FetchSessionCache.complete_full`` opens
    a session for them (``open_session``) or not (sessionless, FINAL_EPOCH)."""

    partitions: list[tuple[PartitionKey, PartitionFetch]]
    open_session: bool
    uses_topic_ids: bool
    privileged: bool


@dataclass(frozen=True, slots=True)
class IncrementalFetch:
    """An incremental fetch: read ``partitions`` (the whole session, in its order); then
    ``FetchSessionCache.complete_incremental`` picks the ones to answer."""

    session: FetchSession
    epoch_expected: int  # the session's epoch this request moved it to
    partitions: list[tuple[PartitionKey, PartitionFetch]]


FetchContext = FullFetch | IncrementalFetch


@dataclass(frozen=True, slots=True)
class IncrementalAnswer:
    """The top-level answer of an incremental fetch and the outcomes it lists (indices
    into the outcomes given, in the order to send)."""

    error_code: int
    session_id: int
    listed: list[int]


@dataclass(slots=True)
class SessionCounters:
    """Kafka's FetchSessionCache metrics, and how fetches were served."""

    evictions: int = 0  # incremental-fetch-session-evictions
    full_fetches: int = 0  # full fetches that opened (or tried to open) a session
    sessionless_fetches: int = 0  # FINAL_EPOCH or pre-v7 full fetches
    incremental_fetches: int = 0
    session_errors: int = 0  # answered 70, 71 or 106


class FetchSessionCache:
    """Every fetch session of one broker, with Kafka's limits and eviction order."""

    def __init__(self, slots_max: int = CACHE_SLOTS_DEFAULT,
                 eviction_ms_min: int = EVICTION_MS_MIN_DEFAULT,
                 new_id: Callable[[], int] | None = None):
        if slots_max < 0 or eviction_ms_min < 0:
            raise ValueError("fetch session cache slots and eviction time must be >= 0")
        self.slots_max = slots_max
        self.eviction_ms_min = eviction_ms_min
        # Random ids, as Kafka's: a client cannot guess another's session.
        self._new_id = new_id or (lambda: random.randint(1, SESSION_ID_MAX))
        self._sessions: dict[int, FetchSession] = {}
        # Sessions by (last used ms, id), least recently used first.
        self._last_used: dict[int, tuple[int, int]] = {}
        self._evictable_by_privileged: dict[int, tuple[bool, int, int]] = {}
        self._evictable_by_all: dict[int, tuple[bool, int, int]] = {}
        self.partitions_count = 0  # Kafka's NumIncrementalFetchPartitionsCached
        self.counters = SessionCounters()

    # ------------------------------------------------------------ views

    def __len__(self) -> int:  # Kafka's NumIncrementalFetchSessions
        return len(self._sessions)

    def get(self, session_id: int) -> FetchSession | None:
        return self._sessions.get(session_id)

    def sessions(self) -> list[FetchSession]:
        return list(self._sessions.values())

    def metrics_view(self) -> FetchSessionView:
        """Read from the metrics server's thread: plain ints, no iteration of the cache."""
        c = self.counters
        return FetchSessionView(len(self._sessions), self.partitions_count, c.evictions,
                                c.full_fetches, c.incremental_fetches,
                                c.sessionless_fetches, c.session_errors)

    # ------------------------------------------------------------ requests

    def new_context(self, session_id: int, epoch: int,
                    wanted: Mapping[PartitionKey, PartitionFetch],
                    forgotten: Iterable[PartitionKey], *, uses_topic_ids: bool,
                    privileged: bool = False) -> FetchContext:
        """Kafka's ``FetchManager.newContext`` for a request's ``(session_id, epoch)``,
        its partitions and forgotten partitions. Raises the session errors above. The
        session's last use is set when its answer is built (``complete_*``)."""
        if epoch in (INITIAL_EPOCH, FINAL_EPOCH):
            if session_id != INVALID_SESSION_ID:
                self.remove(session_id)  # a full fetch closes the session it names
            return FullFetch(list(wanted.items()), open_session=epoch == INITIAL_EPOCH,
                             uses_topic_ids=uses_topic_ids, privileged=privileged)
        session = self._sessions.get(session_id)
        if session is None:
            self.counters.session_errors += 1
            raise FetchSessionIdNotFoundError(f"fetch session {session_id} is not cached")
        if session.epoch != epoch:
            self.counters.session_errors += 1
            raise InvalidFetchSessionEpochError(
                f"fetch session {session_id} expects epoch {session.epoch}, got {epoch}")
        if session.uses_topic_ids != uses_topic_ids:
            self.counters.session_errors += 1
            raise FetchSessionTopicIdError(
                f"fetch session {session_id} was opened "
                f"{'with' if session.uses_topic_ids else 'without'} topic ids")
        session.update(wanted, forgotten)
        if session.size == 0:
            # Nothing left to fetch: closed, and this request is answered sessionless.
            self.remove(session_id)
            return FullFetch([], open_session=False, uses_topic_ids=uses_topic_ids,
                             privileged=privileged)
        session.epoch = next_epoch(session.epoch)
        return IncrementalFetch(session, session.epoch,
                                [(k, c.request) for k, c in session.partitions.items()])

    def complete_full(self, context: FullFetch, outcomes: list[PartitionOutcome],
                      now_ms: int) -> int:
        """After a full fetch's read: the new session's id, or 0 (none opened: the
        request asked for none, or the cache is full and nothing may be evicted)."""
        if not context.open_session:
            self.counters.sessionless_fetches += 1
            return INVALID_SESSION_ID
        self.counters.full_fetches += 1
        size = len(context.partitions)
        if (len(self._sessions) >= self.slots_max
                and not self._try_evict(context.privileged, (context.privileged, size, 0),
                                        now_ms)):
            return INVALID_SESSION_ID
        session_id = self._new_id()
        while session_id == INVALID_SESSION_ID or session_id in self._sessions:
            session_id = self._new_id()
        session = FetchSession(session_id, context.privileged, context.uses_topic_ids,
                               created_ms=now_ms, last_used_ms=now_ms,
                               epoch=next_epoch(INITIAL_EPOCH))
        answered = {o.key: o for o in outcomes}
        for key, request in context.partitions:
            outcome = answered.get(key)
            cached = _CachedPartition(request)
            # An errored partition keeps no high watermark, so that the answer after the
            # error clears lists it (as ``must_respond`` does for incremental fetches).
            if outcome is not None and outcome.error_code == pb.NONE:
                cached.high_watermark = outcome.high_watermark
                cached.log_start_offset = outcome.log_start_offset
                cached.last_stable_offset = outcome.last_stable_offset
            session.partitions[key] = cached
        self._sessions[session_id] = session
        self._touch(session, now_ms)
        return session_id

    def complete_incremental(self, context: IncrementalFetch,
                             outcomes: list[PartitionOutcome], now_ms: int) -> IncrementalAnswer:
        """After an incremental fetch's read (``outcomes`` in the context's order): the
        partitions to answer. INVALID_FETCH_SESSION_EPOCH if another request moved the
        session on meanwhile (a client that does not wait for its answer)."""
        session = context.session
        if self._sessions.get(session.session_id) is not session:
            # Evicted or closed while this fetch waited: the client starts over.
            self.counters.session_errors += 1
            return IncrementalAnswer(pb.FETCH_SESSION_ID_NOT_FOUND, INVALID_SESSION_ID, [])
        if session.epoch != context.epoch_expected:
            self.counters.session_errors += 1
            return IncrementalAnswer(pb.INVALID_FETCH_SESSION_EPOCH, session.session_id, [])
        self.counters.incremental_fetches += 1
        listed: list[int] = []
        for i, outcome in enumerate(outcomes):
            cached = session.partitions.get(outcome.key)
            if cached is None:
                raise InvariantViolation(f"{outcome.key} answered, not in session "
                                         f"{session.session_id}")
            if cached.must_respond(outcome):
                listed.append(i)
                if outcome.records_bytes > 0:
                    session.partitions.move_to_end(outcome.key)
        self._touch(session, now_ms)
        return IncrementalAnswer(pb.NONE, session.session_id, listed)

    def remove(self, session_id: int) -> FetchSession | None:
        session = self._sessions.pop(session_id, None)
        if session is None:
            return None
        self._last_used.pop(session_id, None)
        self._evictable_by_privileged.pop(session_id, None)
        self._evictable_by_all.pop(session_id, None)
        if session.indexed_size >= 0:
            self.partitions_count -= session.indexed_size
        return session

    # ------------------------------------------------------------ eviction

    def _touch(self, session: FetchSession, now_ms: int) -> None:
        """Kafka's ``FetchSessionCache.touch``: last use, size and evictability."""
        session.last_used_ms = now_ms
        self._last_used[session.session_id] = (now_ms, session.session_id)
        if session.indexed_size >= 0:
            self.partitions_count -= session.indexed_size
        session.indexed_size = session.size
        self.partitions_count += session.size
        key = session.evictable_key(session.size)
        old_enough = now_ms - session.created_ms > self.eviction_ms_min
        if not session.privileged or old_enough:
            self._evictable_by_privileged[session.session_id] = key
        else:
            self._evictable_by_privileged.pop(session.session_id, None)
        if old_enough:
            self._evictable_by_all[session.session_id] = key
        else:
            self._evictable_by_all.pop(session.session_id, None)

    def _try_evict(self, privileged: bool, key: tuple[bool, int, int], now_ms: int) -> bool:
        """Make room for a session worth ``key``: evict a stale session, or else the
        least valuable evictable one if it is worth no more than the new one."""
        if not self._last_used:
            return False
        # O(sessions) scans: the cache is small (1000 slots) and this runs only when full.
        lru_id = min(self._last_used, key=self._last_used.__getitem__)
        if now_ms - self._last_used[lru_id][0] > self.eviction_ms_min:
            self.remove(lru_id)
            self.counters.evictions += 1
            return True
        evictable = self._evictable_by_privileged if privileged else self._evictable_by_all
        if not evictable:
            return False
        victim = min(evictable, key=evictable.__getitem__)
        if key < evictable[victim]:
            return False
        self.remove(victim)
        self.counters.evictions += 1
        return True
