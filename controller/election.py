"""Partition leader elections and ISR changes: pure functions, no I/O, no clock.

Theory of operation
-------------------
The controller holds one ``PartitionRecord`` per partition. Every event that
may change a partition (a broker fenced, unfenced, shutting down, a leader's
AlterPartition, the periodic preferred-leader check) is a function here that
takes the current record and the set of live (registered, unfenced, not
shutting down) brokers and returns either ``None`` (nothing changes) or a
``Change`` with the new record. The caller persists the new record and only
then tells the brokers.

Epoch rules (Kafka KRaft):

=====================  ============  ===============
change                 leader_epoch  partition_epoch
=====================  ============  ===============
leader changes         +1            +1
(incl. going offline)
ISR-only change        same          +1
nothing changes        same          same
=====================  ============  ===============

Election rules:

* A clean election picks the first replica in ``replicas`` order (the
  preferred replica comes first) that is both in the ISR and live.
* When no ISR member is live the partition goes offline (``leader == -1``);
  the ISR keeps its last member so that it never becomes empty and we know
  whose data is the newest.
* With ``unclean_allowed`` an offline partition instead takes any live replica
  (replicas order) as leader with ISR = [that replica]; the change is flagged
  ``unclean`` (data below the old high watermark may be lost).
* A fenced or shutting-down broker leaves every ISR it is not the last member
  of, and gives up leadership (to an unclean leader only if allowed).
* The preferred replica (``replicas[0]``) takes leadership back as soon as it
  is live and in the ISR (``maybe_preferred_leader``).
* A replica that found a batch failing its CRC in its own log leaves the ISR;
  when it leads, the first live ISR member in ``replicas`` order takes over
  (``on_replica_corrupt``; clean only: never an out-of-sync replica). It is
  refused when that would empty the ISR or leave the partition without a
  clean leader: a corrupt copy that is the only full one stays where it is.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Set
from dataclasses import dataclass, replace

from tidewater.proto import tidewater_pb2 as pb
from tidewater.proto.errors import InvariantViolation

NO_LEADER = -1


@dataclass(frozen=True, slots=True)
class PartitionRecord:
    """The controller's view of one partition."""

    topic: str
    partition: int
    replicas: tuple[int, ...]  # preferred replica first
    isr: tuple[int, ...]  # never empty
    leader: int  # NO_LEADER: offline
    leader_epoch: int
    partition_epoch: int
    # The topic incarnation's 16-byte ID (proto/topic_id.py); b"" only in code that does not
    # care (tests, the simulation). Every change below keeps it (``replace``).
    topic_id: bytes = b""
    # KIP-455: during a reassignment ``replicas`` is the union of the original and the
    # target sets (target first); these are the target's new members and the originals
    # that go when it completes (``reassignment``). Both empty: no reassignment.
    adding: tuple[int, ...] = ()
    removing: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        # Invariants every record must keep; a violation is a programmer error (at replay,
        # ClusterMetadata.apply calls it a corrupt record instead).
        name = f"{self.topic}-{self.partition}"
        if len(self.topic_id) not in (0, 16):
            raise InvariantViolation(f"{name}: bad topic id")
        if not self.replicas:
            raise InvariantViolation(f"{name}: no replicas")
        if len(set(self.replicas)) != len(self.replicas):
            raise InvariantViolation(f"{name}: duplicate replicas {self.replicas}")
        if not self.isr:
            raise InvariantViolation(f"{name}: empty ISR")
        if not set(self.isr) <= set(self.replicas):
            raise InvariantViolation(f"{name}: ISR {self.isr} not in replicas {self.replicas}")
        if self.leader != NO_LEADER and self.leader not in self.isr:
            raise InvariantViolation(f"{name}: leader {self.leader} not in ISR {self.isr}")
        if (not set(self.adding) | set(self.removing) <= set(self.replicas)
                or set(self.adding) & set(self.removing)):
            raise InvariantViolation(f"{name}: adding {self.adding} / removing {self.removing} "
                                     f"do not fit replicas {self.replicas}")

    @property
    def reassigning(self) -> bool:
        return bool(self.adding or self.removing)

    @property
    def offline(self) -> bool:
        return self.leader == NO_LEADER

    @property
    def under_replicated(self) -> bool:
        return len(self.isr) < len(self.replicas)


@dataclass(frozen=True, slots=True)
class Change:
    """A new record for a partition, and how it came about."""

    record: PartitionRecord
    leader_changed: bool
    unclean: bool = False


def new_partition(topic: str, partition: int, replicas: Iterable[int],
                  live: Set[int], topic_id: bytes = b"") -> PartitionRecord:
    """A freshly created partition: ISR = the live replicas, leader = the first of them.

    With no live replica at all (only possible when the caller allows it) the
    ISR is all replicas and the partition starts offline.
    """
    replicas = tuple(replicas)
    isr = tuple(r for r in replicas if r in live) or replicas
    leader = isr[0] if isr[0] in live else NO_LEADER
    return PartitionRecord(topic, partition, replicas, isr, leader, 0, 0, topic_id)


def _with_leader(p: PartitionRecord, leader: int, isr: tuple[int, ...],
                 *, unclean: bool = False) -> Change | None:
    if leader == p.leader and isr == p.isr:
        return None
    if leader != p.leader:
        record = replace(p, leader=leader, isr=isr, leader_epoch=p.leader_epoch + 1,
                         partition_epoch=p.partition_epoch + 1)
        return Change(record, leader_changed=True, unclean=unclean)
    record = replace(p, isr=isr, partition_epoch=p.partition_epoch + 1)
    return Change(record, leader_changed=False)


def _choose_leader(p: PartitionRecord, isr: tuple[int, ...], live: Set[int],
                   unclean_allowed: bool) -> tuple[int, tuple[int, ...], bool]:
    """(leader, isr, unclean) for ``p`` with ISR ``isr`` given the live brokers."""
    for replica in p.replicas:
        if replica in isr and replica in live:
            return replica, isr, False
    if unclean_allowed:
        for replica in p.replicas:
            if replica in live:
                return replica, (replica,), True
    return NO_LEADER, isr, False


def elect(p: PartitionRecord, live: Set[int], *, unclean_allowed: bool) -> Change | None:
    """Make sure ``p`` has a live leader if it can have one.

    A live leader is kept (use ``maybe_preferred_leader`` to move it back to
    the preferred replica). Otherwise a clean election from the live ISR, else
    unclean if allowed, else offline.
    """
    if p.leader != NO_LEADER and p.leader in live:
        return None
    leader, isr, unclean = _choose_leader(p, p.isr, live, unclean_allowed)
    return _with_leader(p, leader, isr, unclean=unclean)


def _remove_broker(p: PartitionRecord, broker_id: int, live: Set[int],
                   unclean_allowed: bool) -> Change | None:
    if broker_id not in p.replicas:
        return None
    live = set(live) - {broker_id}
    isr = tuple(r for r in p.isr if r != broker_id) or p.isr  # the last member stays
    if p.leader == broker_id:
        leader, isr, unclean = _choose_leader(p, isr, live, unclean_allowed)
        return _with_leader(p, leader, isr, unclean=unclean)
    return _with_leader(p, p.leader, isr)


def on_broker_fenced(p: PartitionRecord, broker_id: int, live: Set[int], *,
                     unclean_allowed: bool) -> Change | None:
    """``broker_id`` missed its session: drop it from the ISR and from leadership."""
    return _remove_broker(p, broker_id, live, unclean_allowed)


def on_broker_unfenced(p: PartitionRecord, broker_id: int, live: Set[int], *,
                       unclean_allowed: bool) -> Change | None:
    """``broker_id`` is back: an offline partition it can lead gets a leader again.

    It does not rejoin the ISR here: its leader adds it (AlterPartition) once it
    has caught up.
    """
    if broker_id not in p.replicas or not p.offline:
        return None
    return elect(p, set(live) | {broker_id}, unclean_allowed=unclean_allowed)


def on_controlled_shutdown(p: PartitionRecord, broker_id: int, live: Set[int], *,
                           unclean_allowed: bool = False) -> Change | None:
    """``broker_id`` is shutting down: move leadership away, leave the ISR.

    When it was the only live ISR member the partition goes offline until an
    ISR member returns, or (as in Kafka) takes an unclean leader when the topic
    allows that: the operator chose availability over those records.
    """
    return _remove_broker(p, broker_id, live, unclean_allowed)


def maybe_preferred_leader(p: PartitionRecord, live: Set[int]) -> Change | None:
    """Move leadership back to ``replicas[0]`` when it is live and in the ISR."""
    preferred = p.replicas[0]
    if p.leader == preferred or preferred not in live or preferred not in p.isr:
        return None
    return _with_leader(p, preferred, p.isr)


def alter_partition(p: PartitionRecord, *, leader_id: int, leader_epoch: int,
                    partition_epoch: int, new_isr: Iterable[int],
                    live: Set[int], broker_epochs: Mapping[int, int] | None = None,
                    registered_epochs: Mapping[int, int] | None = None
                    ) -> tuple[pb.ErrorCode, PartitionRecord]:
    """Validate a leader's ISR proposal; returns (ErrorCode, the record to answer with).

    On NONE the returned record is the committed one (partition_epoch + 1 when
    the ISR changed); on an error it is the unchanged current record, so the
    leader learns the current state either way.

    KIP-903: with ``registered_epochs`` (the controller's broker epochs), a joiner
    is admitted only if ``broker_epochs`` (what the leader saw it fetch with) names
    its registered epoch: the fetches of a restarted broker's previous process
    (which may have lost records since) do not vouch for the new one.
    """
    new_isr = tuple(new_isr)
    if leader_epoch != p.leader_epoch:
        return pb.FENCED_LEADER_EPOCH, p
    if leader_id != p.leader:
        return pb.NOT_LEADER_OR_FOLLOWER, p
    if partition_epoch != p.partition_epoch:
        return pb.INVALID_UPDATE_VERSION, p
    if len(set(new_isr)) != len(new_isr) or leader_id not in new_isr:
        return pb.INVALID_REQUEST, p
    for replica in new_isr:
        if replica not in p.replicas:
            return pb.INELIGIBLE_REPLICA, p
        # Members already in the ISR may be mid-fencing; only joiners must be live.
        if replica not in p.isr and replica not in live:
            return pb.INELIGIBLE_REPLICA, p
        if (replica not in p.isr and registered_epochs is not None
                and (broker_epochs or {}).get(replica, -1) != registered_epochs.get(replica)):
            return pb.INELIGIBLE_REPLICA, p
    if new_isr == p.isr:
        return pb.NONE, p
    return pb.NONE, replace(p, isr=new_isr, partition_epoch=p.partition_epoch + 1)


def on_replica_corrupt(p: PartitionRecord, broker_id: int, *, leader_epoch: int,
                       partition_epoch: int, live: Set[int]) -> tuple[pb.ErrorCode, Change | None]:
    """``broker_id`` found a batch failing its CRC in its own replica of ``p``.

    Returns ``(NONE, change)``: it leaves the ISR and, when it leads, the first
    live ISR member in ``replicas`` order leads (leader_epoch + 1). Otherwise
    ``(ErrorCode, None)`` and nothing changes, checked in this order:

    ==============================  ===============================================
    NOT_LEADER_OR_FOLLOWER          not a replica of ``p``
    FENCED_LEADER_EPOCH             ``leader_epoch`` is not the current one
    INVALID_UPDATE_VERSION          ``partition_epoch`` is not the current one
    INELIGIBLE_REPLICA              not in the ISR (nothing to take away)
    ELIGIBLE_LEADERS_NOT_AVAILABLE  the last ISR member, or the leader with no other
                                    live ISR member (no clean leader to take over)
    ==============================  ===============================================

    The epochs make a late or repeated report harmless: once the replica left
    the ISR, or truncated, refetched and rejoined (partition_epoch moved), an
    old report no longer applies.
    """
    if broker_id not in p.replicas:
        return pb.NOT_LEADER_OR_FOLLOWER, None
    if leader_epoch != p.leader_epoch:
        return pb.FENCED_LEADER_EPOCH, None
    if partition_epoch != p.partition_epoch:
        return pb.INVALID_UPDATE_VERSION, None
    if broker_id not in p.isr:
        return pb.INELIGIBLE_REPLICA, None
    isr = tuple(r for r in p.isr if r != broker_id)
    if not isr:
        return pb.ELIGIBLE_LEADERS_NOT_AVAILABLE, None
    if p.leader != broker_id:
        return pb.NONE, _with_leader(p, p.leader, isr)
    leader, isr, _ = _choose_leader(p, isr, set(live) - {broker_id}, unclean_allowed=False)
    if leader == NO_LEADER:
        return pb.ELIGIBLE_LEADERS_NOT_AVAILABLE, None
    return pb.NONE, _with_leader(p, leader, isr)
