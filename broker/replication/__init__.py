"""Pure replication decisions on the broker side (no I/O, time passed in as ``now_ms``).

``leader_state``: the leader's follower tracking, ISR changes, high watermark
and acks=all answers. ``follower``: where a follower truncates, the HW it
exposes, and the leader's KIP-320 divergence check on a fetch.
"""

from tidewater.broker.replication.follower import (
    TruncationStep,
    check_diverging,
    follower_truncation,
    truncation_for_diverging_epoch,
)
from tidewater.broker.replication.leader_state import (
    FetchDecision,
    FollowerState,
    LeaderPartitionState,
    PendingIsrChange,
)

__all__ = [
    "FetchDecision", "FollowerState", "LeaderPartitionState", "PendingIsrChange",
    "TruncationStep", "check_diverging", "follower_truncation",
    "truncation_for_diverging_epoch",
]
