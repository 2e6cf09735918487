"""Follower-side decisions: where to truncate, what HW to expose; and the leader's divergence check.

Theory of operation
-------------------
A replica that becomes a follower may hold records its new leader never had
(it led before, or it got records from an old leader that did not commit
them). Before fetching it finds the end of the largest epoch it shares with
the leader and truncates there (KIP-101, in the KIP-279 form that compares
epochs, not only offsets):

1. It asks the leader ``OffsetForLeaderEpoch(leader_epoch = its latest epoch)``;
   the leader answers ``(E_L, O_L) = end_offset_for(that epoch, leader LEO)``.
   With a fetch that carries ``last_fetched_epoch`` the leader can answer the
   same pair as a ``diverging_epoch`` instead (``check_diverging``), saving
   the round trip.
2. ``follower_truncation`` turns the answer into a ``TruncationStep``:

   ==========================  =============================================
   answer                      step
   ==========================  =============================================
   ``O_L == -1``               truncate to own HW; done
   own ``end_offset_for(E_L)``  truncate to ``min(O_L, LEO)``; done (the
   is ``(-1, -1)``             follower has no epoch information: Kafka's
                               fallback, the leader's epoch is below ours)
   own epoch ``E_F != E_L``    truncate to ``min(O_F, LEO)``; not done: ask
                               again with the new latest epoch
   ``E_F == E_L``              truncate to ``min(O_F, O_L, LEO)``; done
   ==========================  =============================================

3. The shell drops an answer when the partition's leader epoch changed while
   it was in flight, and calls ``Log.truncate_to(step.truncate_to)`` (which
   also truncates the epoch cache) before fetching from there.

Once fetching, the follower exposes ``HW = min(leader HW, own LEO)``. The
records of a fetch answer are appended from its log end offset on
(``fetched_from_log_end``): the leader answers with whole batches, from the one
holding the fetch offset.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Protocol

from tidewater.proto.errors import OffsetOutOfRangeError

UNDEFINED = -1


class EpochCache(Protocol):
    """What these rules need from ``broker.storage.epoch_cache.LeaderEpochCache``."""

    def end_offset_for(self, requested_epoch: int, log_end_offset: int) -> tuple[int, int]: ...


@dataclass(frozen=True, slots=True)
class TruncationStep:
    """Truncate the log to ``truncate_to``; when not ``done`` ask the leader again."""

    truncate_to: int
    done: bool


def follower_truncation(leader_answer: tuple[int, int], cache: EpochCache,
                        log_end_offset: int, high_watermark: int) -> TruncationStep:
    """Where to truncate given the leader's ``(epoch, end_offset)`` answer (module table)."""
    leader_epoch, leader_end_offset = leader_answer
    if leader_end_offset == UNDEFINED:
        return TruncationStep(min(high_watermark, log_end_offset), done=True)
    own_epoch, own_end_offset = cache.end_offset_for(leader_epoch, log_end_offset)
    if own_end_offset == UNDEFINED:
        return TruncationStep(min(leader_end_offset, log_end_offset), done=True)
    if own_epoch != leader_epoch:
        return TruncationStep(min(own_end_offset, log_end_offset), done=False)
    return TruncationStep(min(own_end_offset, leader_end_offset, log_end_offset), done=True)


def truncation_for_diverging_epoch(diverging_epoch: tuple[int, int], cache: EpochCache,
                                   log_end_offset: int, high_watermark: int) -> TruncationStep:
    """A fetch response's ``diverging_epoch`` is handled exactly like an OffsetForLeaderEpoch answer."""
    return follower_truncation(diverging_epoch, cache, log_end_offset, high_watermark)


def check_diverging(last_fetched_epoch: int, fetch_offset: int, cache: EpochCache,
                    log_end_offset: int) -> tuple[int, int] | None:
    """Leader side (KIP-320): ``(epoch, end_offset)`` to answer as ``diverging_epoch``, or None.

    ``None`` means the follower's log agrees with ours up to ``fetch_offset``
    as far as epochs tell, so the fetch is served normally. A follower that
    sent no epoch (``-1``) is not checked. When our cache cannot place the
    follower's epoch at all the fetch is out of range (Kafka does the same).
    """
    if last_fetched_epoch == UNDEFINED:
        return None
    epoch, end_offset = cache.end_offset_for(last_fetched_epoch, log_end_offset)
    if epoch == UNDEFINED or end_offset == UNDEFINED:
        raise OffsetOutOfRangeError(
            f"cannot find the end offset of the follower's last fetched epoch {last_fetched_epoch}")
    if epoch < last_fetched_epoch or end_offset < fetch_offset:
        return (epoch, end_offset)
    return None


@dataclass(frozen=True, slots=True)
class FetchedCut:
    """What a follower does with a fetched chunk (``fetched_from_log_end``).

    ``truncate_to``: cut the log there first (a batch straddles the LEO), else None.
    ``start_position``: append the chunk from this byte position on; None: nothing to
    append. After a cut, append only what ``append_from`` says.
    """

    truncate_to: int | None
    start_position: int | None

    def append_from(self, log_end_offset: int) -> int | None:
        """The byte position to append from, given the log end offset once ``truncate_to``
        was carried out; None: nothing. A cut drops a batch of our own that straddles it
        whole, so our log may end below the leader's batch: then nothing is appended and
        the next fetch starts from the new LEO."""
        if self.truncate_to is not None and log_end_offset != self.truncate_to:
            return None
        return self.start_position


NOTHING_TO_APPEND = FetchedCut(truncate_to=None, start_position=None)


def fetched_from_log_end(batches: Iterable[tuple[int, int, int]],
                         log_end_offset: int) -> FetchedCut:
    """The part of a fetched chunk that starts at our ``log_end_offset``.

    ``batches``: the chunk's batches in order, each ``(position, base_offset,
    next_offset)`` (its byte position in the chunk, its first offset, its last offset +
    1). Batches wholly below our LEO are skipped (we have them). The first batch that
    reaches past it is appended from its position on: when it starts at or after the
    LEO (after a compacted gap too) as it is; when it straddles the LEO, our batch
    boundaries differ from the leader's there (it should not happen after truncation by
    epochs), so our log is cut back to that batch's base and the leader's batch taken
    instead (``FetchedCut.append_from``). No batch past the LEO: nothing to append.
    """
    for position, base_offset, next_offset in batches:
        if next_offset <= log_end_offset:
            continue
        if base_offset < log_end_offset:
            return FetchedCut(truncate_to=base_offset, start_position=position)
        return FetchedCut(truncate_to=None, start_position=position)
    return NOTHING_TO_APPEND
