"""A ReplicaFetch stream's fetch session: the leader keeps what a follower asks.

A follower's fetch names every partition it follows from this leader, and most of them
are idle: with consumer groups, ``__consumer_offsets``'s 50 partitions put ~16 idle ones
in every follower fetch of a 3-broker cluster. Each was asked, served, encoded, decoded
and applied every round, in the acks=all round's path: 48 idle partitions added 0.5-0.8
ms to the gRPC row's e2e p50 (docs/benchmarks.md, 2026-12-01). So, as Kafka's fetch
sessions do (KIP-227), a stream holds a session, with the stream as its id and the
stream's order as its epoch (``FetchRequest.session_mode``):

- ``SESSIONLESS`` (a follower of an earlier release): the request is read as it is and
  every partition answered; no session.
- ``SESSION_FULL``: the request names every partition; it starts the session over: the
  partitions in order, and nothing answered yet. Every partition is answered.
- ``SESSION_INCREMENTAL``: the request names only the partitions whose position or
  leader epoch moved; each replaces its entry, the others are asked as before. A
  partition not in the session, or no session on the stream, is refused at the request
  level (INVALID_REQUEST, FETCH_SESSION_ID_NOT_FOUND): the follower drops the stream
  and starts over with a full request on a new one.

An incremental request's answer leaves out a partition that the request did not name
when its answer has nothing new: no error, no records, no divergence, and the HW and
log start offset this stream last answered for it. Such an answer would tell the
follower's core nothing (``on_fetch_answer`` with no records only takes the HW and the
log start). The answers say ``session_held``: a follower sends incremental requests only
after one, so a leader of an earlier release (which never says it) gets full requests.

The leader reads again only what can have changed. A partition the request did not name
that has not moved since the session's previous fetch keeps that fetch's answer, and the
core records the fetch the short way (``FetchPath._read``, ``on_follower_fetch_at_end``);
a partition where that held is *settled*. The session listens to its partitions
(``FetchWaiters.listen``: appends, HW moves, leadership changes, DeleteRecords, which
the core tells as an append), and a pass reads only the partitions named, noticed since
the last pass, or not settled; the others keep their answer untouched. Going over every
partition on every pass, as before, cost the leader 135-283 microseconds a record with 16
idle partitions beside one busy one (bench/probes/leader_python.py on two machines;
docs/benchmarks.md, 2026-12-02). A long-poll parks on the session (``park``), woken by
the first append or leadership change of any of its partitions, instead of watching
every partition's key anew each time.

Kafka's leader records every follower's fetch time on every partition of a session, for
the ISR's lag check; here a settled partition's is recorded on a *refresh*: a first pass
that goes over every partition, once a quarter of ``replica.lag.time.max.ms`` has passed
since the last one, or sooner where the fetch's own long-poll could take the time since
past half of it (``to_read``). So a caught-up follower's recorded time is never older
than half the lag time when the check reads it (a follower waiting longer than that is
slower than the lag time allows anyway). A refresh also catches what no notice tells: an
ISR or follower state the controller changed, a log start moved by retention. A fetch
from another broker epoch, or with another ISR eligibility, than the previous one is a
refresh too.
"""

from __future__ import annotations

import asyncio
from collections.abc import Hashable

from tidewater.broker.serving.fetch import FetchedPartition, FetchPass, Wanted, wanted_of
from tidewater.broker.serving.purgatory import FetchWaiters, resolve_once
from tidewater.proto import tidewater_pb2 as pb
from tidewater.proto.errors import FetchSessionIdNotFoundError, InvalidRequestError


class ReplicaFetchSession:
    """One ReplicaFetch stream's session (module docstring). Requests on a stream are
    answered one at a time, in order, so ``take`` and ``answer`` alternate."""

    def __init__(self, waiters: FetchWaiters, lag_ms: int) -> None:
        """``lag_ms``: the leader's ``replica.lag.time.max.ms``."""
        self.wanted: list[Wanted] | None = None  # None: no session on this stream
        # The indexes of ``wanted`` the request being answered named (None: all of them),
        # and the last pass of the previous fetch (``fetch.FollowerSession``).
        self.named: set[int] | None = None
        self.earlier: FetchPass | None = None
        # Indexes noticed since the last pass began, and those not settled (module
        # docstring); ``FetchPath._read`` keeps ``unsettled``.
        self.changed: set[int] = set()
        self.unsettled: set[int] = set()
        self.parked: asyncio.Future[Hashable | None] | None = None
        self._waiters = waiters
        self._refresh_ms = max(lag_ms // 4, 1)
        self._recorded_age_max_ms = max(lag_ms // 2, 1)
        self._refreshed_ms = 0
        self._asker: tuple[int, bool] | None = None  # (broker epoch, ISR eligible)
        # Indexes read since the last answer; None: all of them.
        self._touched: set[int] | None = None
        self._index: dict[tuple[str, int], int] = {}
        # Per partition of ``wanted``: (HW, log start offset) last answered; None: never.
        self._answered: list[tuple[int, int] | None] = []

    @property
    def held(self) -> bool:
        return self.wanted is not None

    def take(self, request: pb.FetchRequest) -> bool:
        """Take the request into the session: True when it is served within it
        (``wanted``, ``named``), False when it is read as it is. Raises the typed error
        refusing the whole request."""
        self.named = None
        mode = request.session_mode
        if mode == pb.SESSION_INCREMENTAL:
            wanted = self.wanted
            if wanted is None:
                raise FetchSessionIdNotFoundError(
                    "an incremental fetch on a stream that holds no fetch session")
            named = set()
            index = self._index
            for entry in wanted_of(request.partitions):
                at = index.get((entry[0], entry[1]))
                if at is None:
                    self.earlier = None  # asks moved that no answer will have seen
                    raise InvalidRequestError(f"{entry[0]}-{entry[1]} is not in this stream's "
                                              f"fetch session")
                wanted[at] = entry
                named.add(at)
            self.named = named
            return True
        if mode == pb.SESSION_FULL:
            wanted = wanted_of(request.partitions)
            index = {(entry[0], entry[1]): at for at, entry in enumerate(wanted)}
            self.close()
            if len(index) != len(wanted):
                raise InvalidRequestError("a partition named twice in a full fetch request")
            self.wanted, self._index, self._answered = wanted, index, [None] * len(wanted)
            self.unsettled = set(range(len(wanted)))
            self._waiters.listen(index, self)
            return True
        # SESSIONLESS, or a mode this release does not know: answered in full, and the
        # answer does not say session_held, so the follower goes on with full requests.
        self.close()
        return False

    def close(self) -> None:
        """No session on the stream (it ended, or starts over): stop listening."""
        if self.wanted is not None:
            self._waiters.unlisten(self._index, self)
        self.wanted = self.earlier = None
        self._index = {}
        self.changed.clear()

    def on_notice(self, key: Hashable, wakes_follower: bool) -> None:
        """A partition of the session changed (``FetchWaiters.listen``)."""
        at = self._index.get(key)  # type: ignore[call-overload]
        if at is None:
            return
        self.changed.add(at)
        parked = self.parked
        if wakes_follower and parked is not None and not parked.done():
            parked.set_result(key)

    async def park(self, timeout_s: float) -> None:
        """Until an append or a leadership change of a partition of the session, or
        ``timeout_s``."""
        loop = asyncio.get_running_loop()
        self.parked = parked = loop.create_future()
        timer = loop.call_later(timeout_s, resolve_once, parked, None)
        try:
            await parked
        finally:
            timer.cancel()
            self.parked = None

    def to_read(self, first_pass: bool, now_ms: int, broker_epoch: int,
                isr_eligible: bool, max_wait_ms: int = 0) -> list[int] | None:
        """The indexes a pass reads, in order; None: every one (a refresh on a first
        pass, module docstring; ``max_wait_ms``: the fetch's long-poll). Forgets what was
        noticed: a pass reads it."""
        changed = self.changed
        if first_pass:
            asker = (broker_epoch, isr_eligible)
            age_ms = now_ms - self._refreshed_ms
            if (self._asker != asker or age_ms >= self._refresh_ms
                    or age_ms + max_wait_ms >= self._recorded_age_max_ms
                    or self.named is None):
                self._asker = asker
                self._refreshed_ms = now_ms
                self._touched = None
                changed.clear()
                return None
            indexes = self.named | changed | self.unsettled
        else:
            indexes = changed | self.unsettled
        changed.clear()
        touched = self._touched
        if touched is not None:
            touched |= indexes
        return sorted(indexes)

    def read_all(self) -> None:
        """A pass read every partition (``FetchPath``: no earlier pass to keep from)."""
        self._touched = None
        self.changed.clear()

    def answer(self, results: list[FetchedPartition]) -> list[FetchedPartition]:
        """What to send of ``results`` (one per partition of ``wanted``, in order)."""
        named = self.named
        answered = self._answered
        touched, self._touched = self._touched, set()
        if named is None:
            if self.wanted is not None:
                answered[:] = [(r.high_watermark, r.log_start_offset) for r in results]
            return results
        out = []
        # A partition no pass read since the last answer has that answer's result.
        for at in range(len(results)) if touched is None else sorted(touched):
            result = results[at]
            last = answered[at]
            if (at in named or result.records or result.error_code
                    or result.diverging is not None or last is None
                    or last[0] != result.high_watermark
                    or last[1] != result.log_start_offset):
                answered[at] = (result.high_watermark, result.log_start_offset)
                out.append(result)
        return out
