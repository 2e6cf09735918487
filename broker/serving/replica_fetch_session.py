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

The leader still goes over every partition of the session on each fetch: the ISR's lag
check needs each follower's position and time, as Kafka's leader reads every partition
of a fetch session. A partition the request did not name that has not moved since the
session's previous fetch keeps that fetch's answer, and the core records the fetch the
short way (``FetchPath._read``, ``on_follower_fetch_at_end``).
"""

from __future__ import annotations

from tidewater.broker.serving.fetch import FetchedPartition, FetchPass, Wanted, wanted_of
from tidewater.proto import tidewater_pb2 as pb
from tidewater.proto.errors import FetchSessionIdNotFoundError, InvalidRequestError


class ReplicaFetchSession:
    """One ReplicaFetch stream's session (module docstring). Requests on a stream are
    answered one at a time, in order, so ``take`` and ``answer`` alternate."""

    def __init__(self) -> None:
        self.wanted: list[Wanted] | None = None  # None: no session on this stream
        # The indexes of ``wanted`` the request being answered named (None: all of them),
        # and the last pass of the previous fetch (``fetch.FollowerSession``).
        self.named: set[int] | None = None
        self.earlier: FetchPass | None = None
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
            self.earlier = None
            if len(index) != len(wanted):
                self.wanted = None
                raise InvalidRequestError("a partition named twice in a full fetch request")
            self.wanted, self._index, self._answered = wanted, index, [None] * len(wanted)
            return True
        # SESSIONLESS, or a mode this release does not know: answered in full, and the
        # answer does not say session_held, so the follower goes on with full requests.
        self.wanted = self.earlier = None
        return False

    def answer(self, results: list[FetchedPartition]) -> list[FetchedPartition]:
        """What to send of ``results`` (one per partition of ``wanted``, in order)."""
        named = self.named
        answered = self._answered
        if named is None:
            if self.wanted is not None:
                answered[:] = [(r.high_watermark, r.log_start_offset) for r in results]
            return results
        out = []
        for at, result in enumerate(results):
            last = answered[at]
            if (at in named or result.records or result.error_code
                    or result.diverging is not None or last is None
                    or last[0] != result.high_watermark
                    or last[1] != result.log_start_offset):
                answered[at] = (result.high_watermark, result.log_start_offset)
                out.append(result)
        return out
