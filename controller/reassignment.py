"""Partition reassignment (Kafka's KIP-455): pure functions, no I/O, no clock.

Theory of operation
-------------------
A reassignment moves a partition from its ``original`` replicas to a ``target``
set in three steps, each one ``partition_changed`` record (durable in the
metadata log, so a controller restart resumes where it was):

1. ``start``: ``replicas`` becomes the union ``target + (original - target)``
   (the target's first replica is the preferred one), ``adding`` the target's
   new members, ``removing`` the originals not in the target. The ISR and the
   leader stay. Every replica gets the LeaderAndIsr: the new ones create their
   log and fetch from the leader, which adds them to the ISR (AlterPartition)
   once they have caught up.
2. ``maybe_complete`` (after every ISR change): once every adding replica is
   in the ISR and the ISR keeps a member outside ``removing``, ``replicas``
   becomes the target, the ISR loses the removed ones, and a leader that is
   being removed hands over to the first target replica in the ISR that is
   live (leader_epoch + 1). Without such a replica it waits.
3. The removed replicas get StopReplica(delete) (the state machine's part).

``cancel`` (Kafka's null replicas) reverts: ``replicas`` goes back to the
originals (``replicas - adding``, in the union's order, as Kafka's
``PartitionReassignmentRevert``: the preferred replica may differ from before), the ISR loses the adding ones, a leader
among them hands over; refused (INVALID_REPLICA_ASSIGNMENT) when no ISR member
would be left. A new target while one is ongoing first reverts, then starts
from the originals, as Kafka's ``ReplicationControlManager`` does.

Epochs: a leader change bumps leader_epoch and partition_epoch; any other
change partition_epoch only (the removed replicas are stopped by StopReplica,
not fenced by an epoch bump; Kafka 3.6+ also bumps the leader epoch then).
"""

from __future__ import annotations

from collections.abc import Sequence, Set
from dataclasses import replace

from tidewater.controller.election import NO_LEADER, Change, PartitionRecord
from tidewater.proto import tidewater_pb2 as pb
from tidewater.proto.errors import TidewaterError


class ReassignmentError(TidewaterError):
    """A reassignment refused with Kafka's code (INVALID_REPLICA_ASSIGNMENT,
    NO_REASSIGNMENT_IN_PROGRESS)."""

    def __init__(self, code: pb.ErrorCode, message: str):
        super().__init__(message)
        self.error_code = code


def _leader_for(p: PartitionRecord, replicas: tuple[int, ...], isr: tuple[int, ...],
                live: Set[int]) -> int:
    """Keep a leader that stays a replica in the ISR; else the first of ``replicas`` in
    ``isr`` that is live; NO_LEADER when none is."""
    if p.leader != NO_LEADER and p.leader in replicas and p.leader in isr:
        return p.leader
    return next((r for r in replicas if r in isr and r in live), NO_LEADER)


def _changed(p: PartitionRecord, *, replicas: tuple[int, ...], isr: tuple[int, ...],
             leader: int, adding: tuple[int, ...], removing: tuple[int, ...]) -> Change | None:
    if (replicas, isr, leader, adding, removing) == (p.replicas, p.isr, p.leader, p.adding,
                                                     p.removing):
        return None
    leader_changed = leader != p.leader
    record = replace(p, replicas=replicas, isr=isr, leader=leader, adding=adding,
                     removing=removing, partition_epoch=p.partition_epoch + 1,
                     leader_epoch=p.leader_epoch + (1 if leader_changed else 0))
    return Change(record, leader_changed=leader_changed)


def revert(p: PartitionRecord, live: Set[int]) -> Change | None:
    """Back to the original replicas (None: nothing to revert). Raises ReassignmentError
    when no ISR member would remain."""
    if not p.reassigning:
        return None
    original = tuple(r for r in p.replicas if r not in p.adding)
    isr = tuple(r for r in p.isr if r in original)
    if not isr:
        raise ReassignmentError(
            pb.INVALID_REPLICA_ASSIGNMENT,
            f"{p.topic}-{p.partition}: reverting to {list(original)} would leave no in-sync "
            "replica")
    leader = _leader_for(p, original, isr, live)
    return _changed(p, replicas=original, isr=isr, leader=leader, adding=(), removing=())


def cancel(p: PartitionRecord, live: Set[int]) -> Change:
    """Kafka's null replicas: NO_REASSIGNMENT_IN_PROGRESS when there is none."""
    change = revert(p, live)
    if change is None:
        raise ReassignmentError(pb.NO_REASSIGNMENT_IN_PROGRESS,
                                f"{p.topic}-{p.partition} has no ongoing reassignment")
    return change


def start(p: PartitionRecord, target: Sequence[int], live: Set[int]) -> Change | None:
    """Begin moving ``p`` to ``target`` (checked by the caller: registered brokers, no
    repeats, not empty); completes at once when nothing is to be added. None: ``p``
    already has exactly these replicas and no reassignment."""
    target = tuple(target)
    reverted = revert(p, live)
    base = reverted.record if reverted is not None else p
    if target == base.replicas:
        return reverted
    original = base.replicas
    replicas = target + tuple(r for r in original if r not in target)
    adding = tuple(r for r in target if r not in original)
    removing = tuple(r for r in original if r not in target)
    leader = _leader_for(base, replicas, base.isr, live)
    step = _changed(base, replicas=replicas, isr=base.isr, leader=leader, adding=adding,
                    removing=removing)
    started = step.record if step is not None else base
    done = maybe_complete(started, live)
    final = done.record if done is not None else started
    if final == p:
        return None
    # One change from ``p``: epochs move once, whatever the steps in between.
    leader_changed = final.leader != p.leader
    return Change(replace(final, partition_epoch=p.partition_epoch + 1,
                          leader_epoch=p.leader_epoch + (1 if leader_changed else 0)),
                  leader_changed=leader_changed)


def maybe_complete(p: PartitionRecord, live: Set[int]) -> Change | None:
    """Switch to the target once every adding replica is in the ISR (Kafka's
    ``PartitionReassignmentReplicas.maybeCompleteReassignment``); None: not yet."""
    if not p.reassigning:
        return None
    if not set(p.adding) <= set(p.isr):
        return None
    isr = tuple(r for r in p.isr if r not in p.removing)
    if not isr:
        return None
    replicas = tuple(r for r in p.replicas if r not in p.removing)
    leader = _leader_for(p, replicas, isr, live)
    if leader == NO_LEADER and p.leader != NO_LEADER:
        return None  # no live target replica in the ISR could lead yet: wait
    return _changed(p, replicas=replicas, isr=isr, leader=leader, adding=(), removing=())


def removed_replicas(old: PartitionRecord, new: PartitionRecord) -> list[int]:
    """The brokers that stop hosting the partition with this change (StopReplica, delete)."""
    return [r for r in old.replicas if r not in new.replicas]
