"""One partition replica on one broker: every replication decision, as a pure state machine.

Theory of operation
-------------------
A ``ReplicaState`` is what a broker knows and decides about its replica of one
partition: its role (nothing yet, leader, follower), the controller's state it
last accepted (leader, leader epoch, partition epoch, replicas, ISR), the high
watermark, the leader's view of its followers (``LeadershipState``, HW and
ISR rules), the AlterPartition proposal in flight, the acks=all requests
waiting for the HW, and, as a follower, where it is in the truncate-then-fetch
cycle. It reads the replica's log through ``LogView`` (offsets and the epoch
cache, all in memory) and never writes it: every event returns a ``Ready``
(``ready.py``) telling the shell what to persist, send, answer and wake.

The broker's shell (``tidewater.broker``) and the simulation's fake broker
(``tests/sim``) both feed this class the same events and carry out its
``Ready``; neither decides anything about replication itself. Time is passed
in as ``now_ms``; nothing here sleeps, reads a clock, opens a file or a socket.

One module per protocol; each holds its events, its rules (a table in its
docstring) and its internals, as a mixin this class combines. The state they
share is ``ReplicaBase``'s (``replica_base.py``), in one place:

=========================  ==========================================================
module                     protocol
=========================  ==========================================================
``replica_control``        the controller's requests (LeaderAndIsr, StopReplica, the
                           minimum ISR), fencing by leader epoch, a failed disk
``replica_produce``        the leader's produce path: the acks pre-check, the local
                           append, acks=all waits and their deadlines
``replica_leading``        the leader's side of replication: follower fetches,
                           OffsetForLeaderEpoch answers, consumer fetch checks,
                           AlterPartition proposals and answers, ticks
``replica_corruption``     a corrupt batch: out of the ISR through the controller,
                           then truncate below it and fetch again
``replica_following``      the follower's cycle: truncate (KIP-101/279), fetch,
                           append, HW = min(leader HW, LEO), error backoff and park
=========================  ==========================================================

Every event goes through the one ``ReplicaState`` of its partition, synchronously:
a decision may take steps of another protocol (a LeaderAndIsr fails the old
leadership's acks=all waits; a tick resends an AlterPartition), never concurrently.
"""

from __future__ import annotations

from tidewater.broker.replication.replica_base import (
    ALTER_PARTITION_BACKOFF_MS,
    ALTER_PARTITION_BACKOFF_MS_MAX,
    UNDEFINED,
    EpochCacheView,
    FollowerCycle,
    FollowerOptions,
    FollowerPhase,
    LeaderAndIsrState,
    LogView,
    ReplicaBase,
    Role,
)
from tidewater.broker.replication.replica_control import ControlEvents
from tidewater.broker.replication.replica_corruption import (
    CORRUPT_REPORT_RETRY_MS,
    CorruptionEvents,
)
from tidewater.broker.replication.replica_following import FollowingEvents
from tidewater.broker.replication.replica_leading import LeadingEvents
from tidewater.broker.replication.replica_produce import (
    ACKS_ALL_WAIT_MS_MAX,
    ProduceEvents,
    acks_all_wait_ms,
)

__all__ = [
    "ACKS_ALL_WAIT_MS_MAX", "ALTER_PARTITION_BACKOFF_MS", "ALTER_PARTITION_BACKOFF_MS_MAX",
    "CORRUPT_REPORT_RETRY_MS", "UNDEFINED", "EpochCacheView", "FollowerCycle", "FollowerOptions",
    "FollowerPhase", "LeaderAndIsrState", "LogView", "ReplicaBase",
    "ReplicaState", "Role", "acks_all_wait_ms",
]


class ReplicaState(ControlEvents, ProduceEvents, LeadingEvents, CorruptionEvents,
                   FollowingEvents):
    """Every replication decision for one partition replica on this broker (module
    docstring; each protocol's events and rules are in its module)."""
