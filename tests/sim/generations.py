"""Follower protocol generations the broker no longer runs, as ``ReplicaState`` subclasses.

The broker's followers ask OffsetForLeaderEpoch before the first fetch of a new leader
epoch (KIP-101/279) and send their last fetched epoch on every fetch (KIP-320). The
simulation also runs followers of older generations, to check the rules still hold
against them (a leader's divergence check, fencing): one that relies on the fetch's
diverging epoch alone (no truncation first) and one that sends pre-KIP-320 fetches (no
last fetched epoch). They are put in from outside, as subclasses, so the product's core
carries no option for them. The scripted core tests (tests/unit/test_replica_state.py)
use the same classes.
"""

from __future__ import annotations

from tidewater.broker.replication.replica import FollowerPhase, ReplicaState

UNDEFINED = -1


class FetchesWithoutTruncatingFirst(ReplicaState):
    """KIP-320 alone: a new leader epoch is followed by fetching at once; the leader's
    ``diverging_epoch`` says where to truncate."""

    def _first_phase(self) -> str:
        return FollowerPhase.FETCHING


class SendsNoLastFetchedEpoch(ReplicaState):
    """Pre-KIP-320 fetches: no last fetched epoch, so the leader checks no divergence."""

    def fetch_position(self) -> tuple[int, int, int]:
        fetch_offset, _, log_start_offset = super().fetch_position()
        return fetch_offset, UNDEFINED, log_start_offset


def replica_class_for(*, truncate_first: bool = True, send_last_fetched_epoch: bool = True,
                      base: type[ReplicaState] = ReplicaState) -> type[ReplicaState]:
    """``base`` (the product's core or a broken variant) as a follower of that generation."""
    generations: list[type[ReplicaState]] = []
    if not truncate_first:
        generations.append(FetchesWithoutTruncatingFirst)
    if not send_last_fetched_epoch:
        generations.append(SendsNoLastFetchedEpoch)
    if not generations:
        return base
    names = "".join(g.__name__ for g in generations)
    return type(f"{base.__name__}{names}", (*generations, base), {})
