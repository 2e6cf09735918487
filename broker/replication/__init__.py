"""Pure replication decisions on the broker side (no I/O, time passed in as ``now_ms``).

``leader_state``: the leader's follower tracking, ISR changes, high watermark
and acks=all answers. ``follower``: where a follower truncates, what of a fetched
chunk it appends, and the leader's KIP-320 divergence check on a fetch.
``replica`` (over ``replica_*``): ``ReplicaState``, every decision of one replica.
"""

from tidewater.broker.replication.follower import (
    FetchedCut,
    TruncationStep,
    check_diverging,
    fetched_from_log_end,
    follower_truncation,
    truncation_for_diverging_epoch,
)
from tidewater.broker.replication.leader_state import (
    FetchDecision,
    FollowerState,
    LeadershipState,
    PendingIsrChange,
)

__all__ = [
    "FetchDecision", "FetchedCut", "FollowerState", "LeadershipState", "PendingIsrChange",
    "TruncationStep", "check_diverging", "fetched_from_log_end", "follower_truncation",
    "truncation_for_diverging_epoch",
]
