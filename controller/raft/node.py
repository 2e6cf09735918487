"""The Raft core of the controller quorum: a pure state machine (KRaft semantics).

Theory of operation
===================

A ``RaftNode`` holds one replica's view of the quorum: its epoch, its vote, the
leader it knows, its log (in memory) and, when it leads, every replica's
progress. It has no socket, file, clock or task: the shell calls

* ``step(message, now_ms)`` for each message that arrives,
* ``tick(now_ms)`` as time passes (timers are deadlines compared with ``now_ms``),
* ``propose(records, now_ms)`` on the leader, ``change_voters(...)`` for KIP-853,
  ``compact(data, now_ms)`` after the application has written a snapshot image,

then, while ``has_ready()``, takes a ``Ready``, carries it out **in field order**
(snapshot, truncate, append, quorum state: each durable before the next step;
then send; then apply ``committed``) and calls ``advance(ready)``. ``step`` and
``tick`` are refused between ``ready()`` and ``advance()``. Because the shell
makes everything in a Ready durable before it sends the Ready's messages, no
message ever depends on state that is not on disk: a vote is persisted before
it is granted, a follower's fetch offset (which the leader counts towards the
high watermark) is durable before the leader sees it. A persist that fails is
not acknowledged: the shell stops the node and restarts it from disk (the
durable log cuts a torn tail); the core never acts as if it had happened.

The leader counts its own log end only once ``advance`` confirmed it durable.

Roles (KRaft's QuorumState; "voter" means this node's (id, directory id) is in
the voter set; observers never leave UNATTACHED/FOLLOWER)

=============  ================================  ===================================
role           event                             next
=============  ================================  ===================================
(start)        quorum state names us leader      RESIGNED (the leader's memory is gone)
(start)        quorum state names another leader FOLLOWER; else UNATTACHED
UNATTACHED     election timeout (voter)          PROSPECTIVE (same epoch)
UNATTACHED     BeginQuorumEpoch / fetch answer   FOLLOWER (of that leader)
FOLLOWER       no fetch answer in fetch timeout  PROSPECTIVE (voter); observers ask
               (or the leader sent EndQuorum)    a random voter who leads
PROSPECTIVE    majority of pre-votes (KIP-996)   CANDIDATE (epoch + 1, votes itself)
PROSPECTIVE    answer naming a leader of this    FOLLOWER
               epoch that we did not know
PROSPECTIVE    election timeout, a leader of     FOLLOWER of it again (it may be
               this epoch known                  alive: the voters refused us)
PROSPECTIVE    election timeout, none known      PROSPECTIVE (a new round)
CANDIDATE      majority of votes                 LEADER (appends LEADER_CHANGE)
CANDIDATE      election timeout                  PROSPECTIVE (same epoch)
LEADER         no fetch from a majority within   RESIGNED (sends EndQuorumEpoch)
               1.5 x fetch timeout (check-quorum)
LEADER         removed from the voters, and the  RESIGNED
               VOTERS entry committed
RESIGNED       election timeout                  PROSPECTIVE
any            a message of a higher epoch       UNATTACHED (or FOLLOWER, leader known)
=============  ================================  ===================================

Votes (real, not pre-): granted once per epoch, to a candidate whose log end
(last epoch, end offset) is at least ours, never while we know a leader in that
epoch, and only when the request names our directory id. A node that restarts
with a wiped disk has a new directory id, so it is not the voter it was and its
empty log cannot elect anyone (KIP-853). Who votes is the candidate's voter set
(ours may lag behind a VOTERS entry we have not fetched yet). Pre-votes change
no state and are refused while we hear from a live leader.

Replication (KIP-595): a follower sends Fetch(fetch_offset = its log end,
last_fetched_epoch). The leader checks the pair against its epoch history: if
the follower's last epoch ends earlier on the leader (or does not exist there),
it answers ``diverging`` (the largest epoch <= last_fetched_epoch and where it
ends) and the follower truncates to min(that end, its own end of that epoch);
if the offset lies behind the leader's log start it answers ``snapshot_id``
(KIP-630: FetchSnapshot in chunks, then the follower's log restarts behind it);
otherwise it answers entries. The high watermark is the largest offset that a
majority of voters holds durably, and moves only once it is past the leader's
epoch start offset (its own LEADER_CHANGE entry is committed: Raft figure 8). A
follower's high watermark is min(leader's, its log end); neither ever decreases.

Membership (KIP-853): the voter set is the last VOTERS entry in the log,
committed or not (else the snapshot's, else the bootstrap set). A leader
appends at most one VOTERS entry at a time, and only after an entry of its own
epoch is committed.
"""

from __future__ import annotations

import enum
import random
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from tidewater.controller.raft.messages import (
    BeginQuorumEpoch,
    EndQuorumEpoch,
    Entry,
    EntryKind,
    FetchError,
    FetchRequest,
    FetchResponse,
    FetchSnapshotRequest,
    FetchSnapshotResponse,
    Message,
    OffsetAndEpoch,
    Snapshot,
    SnapshotId,
    VoteRequest,
    VoteResponse,
    VoterKey,
    decode_voters,
    encode_voters,
)
from tidewater.proto.errors import InvariantViolation


class Role(enum.Enum):
    UNATTACHED = "unattached"
    FOLLOWER = "follower"
    PROSPECTIVE = "prospective"
    CANDIDATE = "candidate"
    LEADER = "leader"
    RESIGNED = "resigned"


class NotLeaderError(Exception):
    """A proposal or membership change reached a node that does not lead (retriable:
    ask ``leader_id``)."""

    retriable = True


class ProposalRejectedError(Exception):
    """The leader cannot take this now (too many uncommitted entries, a membership change
    in flight, the new voter not caught up). Retriable."""

    retriable = True


@dataclass(frozen=True)
class RaftConfig:
    fetch_timeout_ms: int = 2000
    election_timeout_ms: int = 1000  # the randomized timeout is in [this, 2 x this)
    fetch_backoff_ms: int = 50  # a follower's wait after an answer with nothing new
    request_timeout_ms: int = 500  # an unanswered fetch is sent again after this
    begin_quorum_resend_ms: int = 500
    fetch_entries_max: int = 64
    fetch_bytes_max: int = 1024 * 1024  # a fetch answer holds at least one entry, whatever its size
    record_bytes_max: int = 1024 * 1024  # per proposed record (the storage's frame limit is larger)
    snapshot_chunk_bytes_max: int = 64 * 1024
    uncommitted_entries_max: int = 10_000
    voter_catch_up_lag_max: int = 64  # entries a new voter may lag when added
    observer_expiry_ms: int = 60_000  # the leader forgets an observer not heard from this long


@dataclass(frozen=True)
class QuorumState:
    """What a node persists before it acts on it: its epoch, its vote in that epoch and
    the leader it knows in that epoch."""

    epoch: int = 0
    voted_for: VoterKey | None = None
    leader_id: int | None = None


@dataclass(frozen=True)
class Ready:
    """What the shell must do, in field order, then ``advance(ready)``."""

    snapshot_write: Snapshot | None  # a snapshot this node took: save it, then cut the log behind
    snapshot_install: Snapshot | None  # from the leader: save it, empty the log, reset the app
    log_truncate_to: int | None  # cut the durable log to end here (exclusive)
    log_append: tuple[Entry, ...]  # then append these (contiguous from the log end)
    quorum_state: QuorumState | None  # then persist this (atomically)
    send: tuple[Message, ...]  # only now: send
    committed: tuple[Entry, ...]  # apply in order (the app applies DATA entries)
    log_end_offset: int  # the durable log end once this Ready is carried out

    def __bool__(self) -> bool:
        return bool(self.snapshot_write or self.snapshot_install or self.log_append
                    or self.log_truncate_to is not None or self.quorum_state is not None
                    or self.send or self.committed)


@dataclass
class ReplicaProgress:
    """What the leader knows about one replica in its epoch."""

    log_end_offset: int = 0  # validated fetch offset: durable on that replica
    last_fetch_ms: int | None = None
    # Kafka's lastCaughtUpTimestamp: when its fetch last reached our log end (or the end
    # we had at its previous fetch), and the log end it fetched against then.
    last_caught_up_ms: int | None = None
    last_fetch_leader_end: int = 0


@dataclass(frozen=True)
class ReplicaDescription:
    key: VoterKey
    is_voter: bool
    log_end_offset: int
    lag: int
    last_fetch_ms: int | None
    last_caught_up_ms: int | None = None


@dataclass(frozen=True)
class QuorumDescription:
    """``describe --status --replication``: on the leader every replica's progress."""

    local: VoterKey
    role: Role
    epoch: int
    leader_id: int | None
    high_watermark: int
    log_start_offset: int
    log_end_offset: int
    voters: frozenset[VoterKey]
    replicas: tuple[ReplicaDescription, ...] = field(default=())


class RaftNode:
    def __init__(self, config: RaftConfig, local: VoterKey, rng: random.Random, now_ms: int, *,
                 bootstrap_voters: frozenset[VoterKey], quorum_state: QuorumState,
                 snapshot: Snapshot | None = None, entries: Sequence[Entry] = (),
                 bootstrap_servers: frozenset[int] = frozenset()):
        self.config = config
        # Kafka's controller.quorum.bootstrap.servers: whom an observer that knows no voter
        # yet (formatted with --no-initial-controllers) asks who leads.
        self._bootstrap_servers = bootstrap_servers
        self.local = local
        self._rng = rng
        self.epoch = quorum_state.epoch
        self.voted_for = quorum_state.voted_for
        self.leader_id = quorum_state.leader_id
        self._snapshot = snapshot
        self.log_start_offset = snapshot.snapshot_id.offset if snapshot else 0
        self._base_voters = snapshot.voters if snapshot else bootstrap_voters
        self._log: list[Entry] = []
        self._epoch_starts: list[tuple[int, int]] = []  # (epoch, first offset) in _log
        self._voter_changes: list[tuple[int, frozenset[VoterKey]]] = []  # VOTERS in _log
        self._dirty_from: int | None = None  # the lowest offset changed since the last Ready
        self._append(entries)
        self._dirty_from = None  # what we were given is on disk already
        self.high_watermark = self.log_start_offset
        self._applied = self.log_start_offset  # committed entries handed out up to here
        self._durable_end = self.log_end_offset
        self._quorum_dirty = False
        self._snapshot_write: Snapshot | None = None
        self._snapshot_install: Snapshot | None = None
        self._outbox: list[Message] = []
        self._in_flight_ready: Ready | None = None
        # Unique across restarts: an answer to a request of our previous life must not match.
        self._correlation = rng.getrandbits(48)
        # timers and per-role state
        self.role = Role.UNATTACHED
        self._election_deadline_ms = 0
        self._fetch_deadline_ms = 0
        self._next_fetch_ms = 0
        self._fetch_in_flight: tuple[int, int] | None = None  # (correlation id, sent at)
        self._last_leader_contact_ms: int | None = None
        self._leader_resigned = False
        self._snapshot_fetch: tuple[SnapshotId, bytearray] | None = None
        self._grants: set[int] = set()
        self._epoch_start_offset = 0
        self._progress: dict[VoterKey, ReplicaProgress] = {}
        self._next_begin_quorum_ms = 0
        self._leader_since_ms = 0
        if self.leader_id == local.id:
            # We led this epoch before a restart: our in-memory state is gone, resign.
            self.role = Role.RESIGNED
            self._reset_election_deadline(now_ms)
        elif self.leader_id is not None:
            self._enter_follower(now_ms)
        else:
            self._reset_election_deadline(now_ms)

    # ---- the log in memory ----------------------------------------------------------

    @property
    def log_end_offset(self) -> int:
        return self.log_start_offset + len(self._log)

    @property
    def snapshot_id(self) -> SnapshotId | None:
        return self._snapshot.snapshot_id if self._snapshot else None

    @property
    def last_epoch(self) -> int:
        if self._log:
            return self._log[-1].epoch
        return self._snapshot.snapshot_id.epoch if self._snapshot else 0

    @property
    def voters(self) -> frozenset[VoterKey]:
        return self._voter_changes[-1][1] if self._voter_changes else self._base_voters

    @property
    def is_voter(self) -> bool:
        return self.local in self.voters

    @property
    def is_leader(self) -> bool:
        return self.role is Role.LEADER

    def entries(self, start: int, end: int) -> list[Entry]:
        start = max(start, self.log_start_offset)
        return self._log[start - self.log_start_offset:end - self.log_start_offset]

    def _append(self, entries: Iterable[Entry]) -> None:
        for entry in entries:
            if entry.offset != self.log_end_offset or entry.epoch < self.last_epoch:
                raise InvariantViolation(
                    f"{self.local}: entry {entry.offset}@{entry.epoch} does not follow "
                    f"log end {self.log_end_offset}@{self.last_epoch}")
            if not self._epoch_starts or self._epoch_starts[-1][0] != entry.epoch:
                self._epoch_starts.append((entry.epoch, entry.offset))
            if entry.kind is EntryKind.VOTERS:
                self._voter_changes.append((entry.offset, decode_voters(entry.data)))
            self._log.append(entry)
            if self._dirty_from is None or entry.offset < self._dirty_from:
                self._dirty_from = entry.offset

    def _truncate(self, end_offset: int) -> None:
        if end_offset < self.high_watermark:
            raise InvariantViolation(f"{self.local}: truncating to {end_offset}, below the "
                                     f"high watermark {self.high_watermark}")
        if end_offset >= self.log_end_offset:
            return
        del self._log[end_offset - self.log_start_offset:]
        while self._epoch_starts and self._epoch_starts[-1][1] >= end_offset:
            self._epoch_starts.pop()
        while self._voter_changes and self._voter_changes[-1][0] >= end_offset:
            self._voter_changes.pop()
        if self._dirty_from is None or end_offset < self._dirty_from:
            self._dirty_from = end_offset

    def end_offset_for_epoch(self, epoch: int) -> OffsetAndEpoch:
        """The largest epoch <= ``epoch`` in the log and the offset where it ends."""
        found: OffsetAndEpoch | None = None
        for index, (entry_epoch, _start) in enumerate(self._epoch_starts):
            if entry_epoch > epoch:
                break
            end = (self._epoch_starts[index + 1][1] if index + 1 < len(self._epoch_starts)
                   else self.log_end_offset)
            found = OffsetAndEpoch(end, entry_epoch)
        if found is not None:
            return found
        if self._snapshot and self._snapshot.snapshot_id.epoch <= epoch:
            return OffsetAndEpoch(self.log_start_offset, self._snapshot.snapshot_id.epoch)
        return OffsetAndEpoch(0, 0)

    def _epoch_before(self, offset: int) -> int:
        """The epoch of the entry at ``offset - 1``."""
        if offset == self.log_start_offset:
            return self._snapshot.snapshot_id.epoch if self._snapshot else 0
        return self._log[offset - 1 - self.log_start_offset].epoch

    def _voters_at(self, offset: int) -> frozenset[VoterKey]:
        voters = self._base_voters
        for change_offset, change in self._voter_changes:
            if change_offset < offset:
                voters = change
        return voters

    # ---- the shell's interface ------------------------------------------------------

    def _check_not_in_flight(self) -> None:
        if self._in_flight_ready is not None:
            raise InvariantViolation(f"{self.local}: an event between ready() and advance()")

    def propose(self, records: Sequence[bytes], now_ms: int) -> int:
        """Append DATA entries; returns the offset of the first. Raises NotLeaderError."""
        self._check_not_in_flight()
        if self.role is not Role.LEADER:
            raise NotLeaderError(f"node {self.local.id} does not lead; leader {self.leader_id}")
        if self.log_end_offset + len(records) - self.high_watermark > self.config.uncommitted_entries_max:
            raise ProposalRejectedError("too many uncommitted entries")
        if any(len(r) > self.config.record_bytes_max for r in records):
            raise ProposalRejectedError(f"a record is larger than {self.config.record_bytes_max} bytes")
        first = self.log_end_offset
        self._append(Entry(first + i, self.epoch, EntryKind.DATA, bytes(r))
                     for i, r in enumerate(records))
        return first

    def change_voters(self, *, add: VoterKey | None = None, remove: VoterKey | None = None,
                      now_ms: int) -> int:
        """KIP-853 AddVoter/RemoveVoter: one at a time, through the log. Returns the offset
        of the VOTERS entry; the change is done once that offset is committed."""
        self._check_not_in_flight()
        if self.role is not Role.LEADER:
            raise NotLeaderError(f"node {self.local.id} does not lead; leader {self.leader_id}")
        if self.high_watermark <= self._epoch_start_offset:
            raise ProposalRejectedError("no entry of this epoch is committed yet")
        if self._voter_changes and self._voter_changes[-1][0] >= self.high_watermark:
            raise ProposalRejectedError("a voter change is still uncommitted")
        voters = set(self.voters)
        if add is not None:
            if any(v.id == add.id for v in voters):
                raise ProposalRejectedError(f"node {add.id} is a voter already")
            progress = self._progress.get(add)
            if (progress is None or progress.log_end_offset
                    < self.log_end_offset - self.config.voter_catch_up_lag_max):
                raise ProposalRejectedError(f"{add} has not caught up")
            voters.add(add)
        if remove is not None:
            if remove not in voters:
                raise ProposalRejectedError(f"{remove} is not a voter")
            voters.discard(remove)
        if not voters or voters == set(self.voters):
            raise ProposalRejectedError("no change")
        offset = self.log_end_offset
        self._append([Entry(offset, self.epoch, EntryKind.VOTERS, encode_voters(frozenset(voters)))])
        self._track_voters()
        return offset

    def compact(self, data: bytes, now_ms: int) -> Snapshot:
        """The application's image up to every committed entry handed out so far becomes
        a snapshot; the log behind it is cut (the Ready carries ``snapshot_write``)."""
        self._check_not_in_flight()
        end = self._applied
        if end <= self.log_start_offset:
            raise ProposalRejectedError("nothing applied since the last snapshot")
        snapshot = Snapshot(SnapshotId(end, self._epoch_before(end)), self._voters_at(end), data)
        self._base_voters = snapshot.voters
        del self._log[:end - self.log_start_offset]
        self._voter_changes = [(o, v) for o, v in self._voter_changes if o >= end]
        self._epoch_starts = []
        for entry in self._log:
            if not self._epoch_starts or self._epoch_starts[-1][0] != entry.epoch:
                self._epoch_starts.append((entry.epoch, entry.offset))
        self.log_start_offset = end
        self._snapshot = snapshot
        self._snapshot_write = snapshot
        return snapshot

    def has_ready(self) -> bool:
        return (self._dirty_from is not None or self._quorum_dirty or bool(self._outbox)
                or self._snapshot_write is not None or self._snapshot_install is not None
                or self._applied < self.high_watermark)

    def ready(self) -> Ready:
        self._check_not_in_flight()
        truncate_to: int | None = None
        append: tuple[Entry, ...] = ()
        if self._dirty_from is not None:
            if self._dirty_from < self._durable_end and self._snapshot_install is None:
                truncate_to = self._dirty_from
            append = tuple(self.entries(self._dirty_from, self.log_end_offset))
        committed = tuple(self.entries(self._applied, self.high_watermark))
        ready = Ready(
            snapshot_write=self._snapshot_write, snapshot_install=self._snapshot_install,
            log_truncate_to=truncate_to, log_append=append,
            quorum_state=self.quorum_state if self._quorum_dirty else None,
            send=tuple(self._outbox), committed=committed, log_end_offset=self.log_end_offset)
        self._outbox = []
        self._in_flight_ready = ready
        return ready

    def advance(self, ready: Ready, now_ms: int) -> None:
        """The shell carried ``ready`` out: everything in it is durable, sent, applied."""
        if ready is not self._in_flight_ready:
            raise InvariantViolation(f"{self.local}: advance() of a Ready not handed out")
        self._in_flight_ready = None
        self._durable_end = ready.log_end_offset
        self._dirty_from = None
        self._quorum_dirty = False
        self._snapshot_write = self._snapshot_install = None
        if ready.committed:
            self._applied = ready.committed[-1].offset + 1
        if self.role is Role.LEADER:
            self._maybe_advance_high_watermark(now_ms)

    @property
    def quorum_state(self) -> QuorumState:
        return QuorumState(self.epoch, self.voted_for, self.leader_id)

    def describe(self, now_ms: int) -> QuorumDescription:
        replicas: list[ReplicaDescription] = []
        if self.role is Role.LEADER:
            for key, progress in sorted(self._progress.items()):
                end = self._durable_end if key == self.local else progress.log_end_offset
                replicas.append(ReplicaDescription(
                    key, key in self.voters, end, self.log_end_offset - end,
                    now_ms if key == self.local else progress.last_fetch_ms,
                    now_ms if key == self.local else progress.last_caught_up_ms))
        return QuorumDescription(self.local, self.role, self.epoch, self.leader_id,
                                 self.high_watermark, self.log_start_offset,
                                 self.log_end_offset, self.voters, tuple(replicas))

    # ---- time -----------------------------------------------------------------------

    def tick(self, now_ms: int) -> None:
        self._check_not_in_flight()
        role = self.role
        if role is Role.LEADER:
            self._leader_tick(now_ms)
        elif role is Role.FOLLOWER:
            if now_ms >= self._fetch_deadline_ms and self.is_voter:
                self._enter_prospective(now_ms)
            else:
                self._maybe_send_fetch(now_ms)
        elif role is Role.UNATTACHED and not self.is_voter:
            self._maybe_send_fetch(now_ms)  # an observer asks voters who leads
        elif now_ms >= self._election_deadline_ms:
            if role is Role.CANDIDATE or role is Role.RESIGNED or role is Role.UNATTACHED:
                if self.is_voter:
                    self._enter_prospective(now_ms)
                else:
                    self._reset_election_deadline(now_ms)
            elif role is Role.PROSPECTIVE and self.leader_id not in (None, self.local.id):
                # The election failed and we know this epoch's leader: try it again (the
                # voters that refused us may hear from it), as KIP-996's prospective does.
                self._clear_role_state()
                self._enter_follower(now_ms)
            elif role is Role.PROSPECTIVE:
                self._enter_prospective(now_ms)

    def _reset_election_deadline(self, now_ms: int) -> None:
        timeout = self.config.election_timeout_ms
        self._election_deadline_ms = now_ms + timeout + self._rng.randrange(timeout)

    # ---- transitions ----------------------------------------------------------------

    def _set_quorum_state(self, epoch: int, voted_for: VoterKey | None, leader_id: int | None) -> None:
        if epoch < self.epoch:
            raise InvariantViolation(f"{self.local}: epoch going back {self.epoch} -> {epoch}")
        if epoch == self.epoch and self.voted_for is not None and voted_for != self.voted_for:
            raise InvariantViolation(f"{self.local}: a second vote in epoch {epoch}: "
                                     f"{self.voted_for} then {voted_for}")
        if epoch == self.epoch and self.leader_id is not None and leader_id != self.leader_id:
            raise InvariantViolation(f"{self.local}: two leaders of epoch {epoch}: "
                                     f"{self.leader_id} and {leader_id}")
        if (epoch, voted_for, leader_id) != (self.epoch, self.voted_for, self.leader_id):
            self.epoch, self.voted_for, self.leader_id = epoch, voted_for, leader_id
            self._quorum_dirty = True

    def _clear_role_state(self) -> None:
        self._fetch_in_flight = None
        self._snapshot_fetch = None
        self._grants = set()
        self._progress = {}
        self._leader_resigned = False

    def _enter_unattached(self, epoch: int, now_ms: int) -> None:
        self._set_quorum_state(epoch, None, None)
        self._clear_role_state()
        self.role = Role.UNATTACHED
        self._next_fetch_ms = now_ms
        self._reset_election_deadline(now_ms)

    def _enter_follower_of(self, epoch: int, leader_id: int, now_ms: int) -> None:
        if epoch == self.epoch and self.role is Role.LEADER:
            raise InvariantViolation(f"{self.local}: leads epoch {epoch}, and node {leader_id} "
                                     f"claims it too")
        voted_for = self.voted_for if epoch == self.epoch else None
        self._set_quorum_state(epoch, voted_for, leader_id)
        self._clear_role_state()
        self._last_leader_contact_ms = now_ms  # it, or a message naming it, just reached us
        self._enter_follower(now_ms)

    def _enter_follower(self, now_ms: int) -> None:
        # _last_leader_contact_ms moves only when the leader is heard from: a node that
        # follows a leader it lost (after a restart or a failed election) grants pre-votes.
        self.role = Role.FOLLOWER
        self._fetch_deadline_ms = now_ms + self.config.fetch_timeout_ms
        self._next_fetch_ms = now_ms
        self._maybe_send_fetch(now_ms)

    def _maybe_bump_epoch(self, epoch: int, leader_id: int | None, now_ms: int) -> bool:
        """A message shows a newer epoch: follow its leader if it names one. True if so."""
        if epoch <= self.epoch:
            return False
        if leader_id is not None and leader_id != self.local.id:
            self._enter_follower_of(epoch, leader_id, now_ms)
        else:
            self._enter_unattached(epoch, now_ms)
        return True

    def _enter_prospective(self, now_ms: int) -> None:
        self._clear_role_state()
        self.role = Role.PROSPECTIVE
        self._reset_election_deadline(now_ms)
        self._grants = {self.local.id}
        self._request_votes(pre_vote=True, now_ms=now_ms)
        self._maybe_win(now_ms)

    def _enter_candidate(self, now_ms: int) -> None:
        self._set_quorum_state(self.epoch + 1, self.local, None)
        self._clear_role_state()
        self.role = Role.CANDIDATE
        self._reset_election_deadline(now_ms)
        self._grants = {self.local.id}
        self._request_votes(pre_vote=False, now_ms=now_ms)
        self._maybe_win(now_ms)

    def _request_votes(self, *, pre_vote: bool, now_ms: int) -> None:
        candidate_epoch = self.epoch + 1 if pre_vote else self.epoch
        for voter in sorted(self.voters):
            if voter.id != self.local.id:
                self._outbox.append(VoteRequest(
                    self.local, voter.id, voter.directory_id, candidate_epoch,
                    self.last_epoch, self.log_end_offset, pre_vote))

    def _maybe_win(self, now_ms: int) -> None:
        voter_ids = {v.id for v in self.voters}
        if len(self._grants & voter_ids) * 2 <= len(voter_ids):
            return
        if self.role is Role.PROSPECTIVE:
            self._enter_candidate(now_ms)
        elif self.role is Role.CANDIDATE:
            self._enter_leader(now_ms)

    def _enter_leader(self, now_ms: int) -> None:
        self._set_quorum_state(self.epoch, self.voted_for, self.local.id)
        self._clear_role_state()
        self.role = Role.LEADER
        self._leader_since_ms = now_ms
        self._epoch_start_offset = self.log_end_offset
        self._append([Entry(self.log_end_offset, self.epoch, EntryKind.LEADER_CHANGE, b"")])
        self._track_voters()
        for progress in self._progress.values():
            progress.last_fetch_ms = now_ms  # check-quorum's grace: a full timeout from now
        self._next_begin_quorum_ms = now_ms
        self._leader_tick(now_ms)

    def _track_voters(self) -> None:
        for voter in self.voters:
            self._progress.setdefault(voter, ReplicaProgress())

    def _resign(self, now_ms: int) -> None:
        self._clear_role_state()
        self.role = Role.RESIGNED
        self._reset_election_deadline(now_ms)
        for voter in sorted(self.voters):
            if voter != self.local:
                self._outbox.append(EndQuorumEpoch(self.local, voter.id, self.epoch))

    # ---- leader ---------------------------------------------------------------------

    def _leader_tick(self, now_ms: int) -> None:
        if self._check_quorum_lost(now_ms):
            self._resign(now_ms)
            return
        if now_ms >= self._next_begin_quorum_ms:
            self._next_begin_quorum_ms = now_ms + self.config.begin_quorum_resend_ms
            # Bound the progress table: every wiped incarnation is a new observer key.
            voters = self.voters
            for key in [k for k, p in self._progress.items() if k not in voters and (
                    p.last_fetch_ms is None
                    or now_ms - p.last_fetch_ms > self.config.observer_expiry_ms)]:
                del self._progress[key]
            for voter in sorted(self.voters):
                progress = self._progress.get(voter)
                if voter != self.local and (progress is None or progress.last_fetch_ms is None
                                            or progress.last_fetch_ms <= self._leader_since_ms):
                    self._outbox.append(BeginQuorumEpoch(self.local, voter.id,
                                                         voter.directory_id, self.epoch))

    def _check_quorum_lost(self, now_ms: int) -> bool:
        voters = self.voters
        limit_ms = self.config.fetch_timeout_ms * 3 // 2
        in_contact = sum(1 for v in voters if v == self.local or (
            (p := self._progress.get(v)) is not None and p.last_fetch_ms is not None
            and now_ms - p.last_fetch_ms < limit_ms))
        return in_contact * 2 <= len(voters)

    def _majority_end_offset(self) -> int:
        """The largest offset a majority of voters holds durably."""
        ends = sorted((self._durable_end if v == self.local else self._progress[v].log_end_offset
                       for v in self.voters), reverse=True)
        return ends[len(ends) // 2]

    def _may_commit(self, offset: int) -> bool:
        """Raft figure 8: only an entry of our own epoch commits by counting replicas."""
        return offset > self._epoch_start_offset

    def _maybe_advance_high_watermark(self, now_ms: int) -> None:
        candidate = min(self._majority_end_offset(), self._durable_end)
        if candidate > self.high_watermark and self._may_commit(candidate):
            self.high_watermark = candidate
            if (self.local not in self.voters and self._voter_changes
                    and self._voter_changes[-1][0] < self.high_watermark):
                self._resign(now_ms)  # our removal is committed

    def _on_fetch_request(self, request: FetchRequest, now_ms: int) -> None:
        def answer(error: FetchError, *, high_watermark: int = 0, entries: tuple[Entry, ...] = (),
                   diverging: OffsetAndEpoch | None = None,
                   snapshot_id: SnapshotId | None = None) -> None:
            self._outbox.append(FetchResponse(
                self.local, request.source.id, self.epoch, self.leader_id,
                request.correlation_id, error, high_watermark, entries, diverging, snapshot_id))

        if self.role is not Role.LEADER or request.epoch > self.epoch:
            answer(FetchError.NOT_LEADER if request.epoch <= self.epoch
                   else FetchError.UNKNOWN_LEADER_EPOCH)
            return
        if request.epoch < self.epoch:
            answer(FetchError.FENCED_LEADER_EPOCH)
            return
        progress = self._progress.setdefault(request.source, ReplicaProgress())
        previous_fetch_ms = progress.last_fetch_ms
        progress.last_fetch_ms = now_ms
        offset, last_epoch = request.fetch_offset, request.last_fetched_epoch
        if self._snapshot is not None and (
                offset < self.log_start_offset
                or (offset == self.log_start_offset and last_epoch != self._snapshot.snapshot_id.epoch)):
            answer(FetchError.NONE, high_watermark=self.high_watermark,
                   snapshot_id=self._snapshot.snapshot_id)
            return
        end = self.end_offset_for_epoch(last_epoch)
        if offset > 0 and (end.epoch != last_epoch or end.offset < offset):
            if end.offset < self.log_start_offset and self._snapshot is not None:
                answer(FetchError.NONE, high_watermark=self.high_watermark,
                       snapshot_id=self._snapshot.snapshot_id)
            else:
                answer(FetchError.NONE, high_watermark=self.high_watermark, diverging=end)
            return
        if offset > self.log_end_offset:
            raise InvariantViolation(f"{self.local}: {request.source} fetches {offset}, past our "
                                     f"log end {self.log_end_offset} in our epoch")
        progress.log_end_offset = max(progress.log_end_offset, offset)
        # As Kafka's LeaderState.ReplicaState.updateFollowerState.
        if offset >= self.log_end_offset:
            progress.last_caught_up_ms = max(progress.last_caught_up_ms or 0, now_ms)
        elif (progress.last_fetch_leader_end > 0 and offset >= progress.last_fetch_leader_end
              and previous_fetch_ms is not None):
            progress.last_caught_up_ms = max(progress.last_caught_up_ms or 0, previous_fetch_ms)
        progress.last_fetch_leader_end = self.log_end_offset
        self._maybe_advance_high_watermark(now_ms)
        entries = tuple(self._bounded(self.entries(offset, offset + self.config.fetch_entries_max)))
        answer(FetchError.NONE, high_watermark=min(self.high_watermark, offset + len(entries)),
               entries=entries)

    def _bounded(self, entries: list[Entry]) -> list[Entry]:
        total = 0
        for count, entry in enumerate(entries):
            total += len(entry.data)
            if count and total > self.config.fetch_bytes_max:
                return entries[:count]
        return entries

    def _on_fetch_snapshot_request(self, request: FetchSnapshotRequest, now_ms: int) -> None:
        snapshot = self._snapshot
        found = (self.role is Role.LEADER and request.epoch == self.epoch and snapshot is not None
                 and snapshot.snapshot_id == request.snapshot_id
                 and 0 <= request.position <= len(snapshot.data))
        if snapshot is None or not found:
            self._outbox.append(FetchSnapshotResponse(
                self.local, request.source.id, self.epoch, self.leader_id,
                request.correlation_id,
                FetchError.NONE if request.epoch == self.epoch else FetchError.FENCED_LEADER_EPOCH,
                request.snapshot_id))
            return
        progress = self._progress.setdefault(request.source, ReplicaProgress())
        progress.last_fetch_ms = now_ms
        chunk = snapshot.data[request.position:request.position + self.config.snapshot_chunk_bytes_max]
        self._outbox.append(FetchSnapshotResponse(
            self.local, request.source.id, self.epoch, self.leader_id, request.correlation_id,
            FetchError.NONE, snapshot.snapshot_id, True, request.position, len(snapshot.data),
            snapshot.voters, chunk))

    # ---- follower -------------------------------------------------------------------

    def _maybe_send_fetch(self, now_ms: int) -> None:
        if self._fetch_in_flight is not None:
            if now_ms - self._fetch_in_flight[1] < self.config.request_timeout_ms:
                return
            self._fetch_in_flight = None
        if now_ms < self._next_fetch_ms:
            return
        if self.role is Role.FOLLOWER and now_ms < self._fetch_deadline_ms:
            assert self.leader_id is not None
            destination = self.leader_id
        else:  # an observer that lost its leader asks any voter
            others = (sorted(v.id for v in self.voters if v.id != self.local.id)
                      or sorted(i for i in self._bootstrap_servers if i != self.local.id))
            if not others:
                return
            destination = self._rng.choice(others)
            self._next_fetch_ms = now_ms + self.config.request_timeout_ms
        self._correlation += 1
        self._fetch_in_flight = (self._correlation, now_ms)
        if self._snapshot_fetch is not None:
            snapshot_id, received = self._snapshot_fetch
            self._outbox.append(FetchSnapshotRequest(self.local, destination, self.epoch,
                                                     snapshot_id, len(received), self._correlation))
        else:
            self._outbox.append(FetchRequest(self.local, destination, self.epoch,
                                             self.log_end_offset, self.last_epoch, self._correlation))

    def _accept_fetch_answer(self, correlation_id: int, epoch: int, leader_id: int | None,
                             error: FetchError, now_ms: int) -> bool:
        """Common checks of a (snapshot) fetch answer; True if it is for the fetch in flight
        and from our leader in our epoch."""
        if self._fetch_in_flight is None or self._fetch_in_flight[0] != correlation_id:
            return False  # late or duplicated
        self._fetch_in_flight = None
        if self._maybe_bump_epoch(epoch, leader_id, now_ms) or epoch < self.epoch:
            return False
        if error is not FetchError.NONE:
            if (self.role is Role.UNATTACHED and leader_id is not None
                    and leader_id != self.local.id and self.leader_id is None):
                self._enter_follower_of(epoch, leader_id, now_ms)
            else:
                self._next_fetch_ms = now_ms + self.config.fetch_backoff_ms
            return False
        if self.role is not Role.FOLLOWER:
            if (self.role is Role.UNATTACHED and leader_id is not None
                    and leader_id != self.local.id):
                self._enter_follower_of(epoch, leader_id, now_ms)
            return False
        self._fetch_deadline_ms = now_ms + self.config.fetch_timeout_ms
        self._last_leader_contact_ms = now_ms
        self._leader_resigned = False
        return True

    def _on_fetch_response(self, response: FetchResponse, now_ms: int) -> None:
        if not self._accept_fetch_answer(response.correlation_id, response.epoch,
                                         response.leader_id, response.error, now_ms):
            return
        fetch_again_now = True
        if response.diverging is not None:
            local = self.end_offset_for_epoch(response.diverging.epoch)
            self._truncate(min(local.offset, response.diverging.offset))
        elif response.snapshot_id is not None:
            self._snapshot_fetch = (response.snapshot_id, bytearray())
        elif response.entries:
            self._append(response.entries)
        else:
            fetch_again_now = False
        new_hw = min(response.high_watermark, self.log_end_offset)
        if response.diverging is None and response.snapshot_id is None and new_hw > self.high_watermark:
            self.high_watermark = new_hw
        self._next_fetch_ms = now_ms if fetch_again_now else now_ms + self.config.fetch_backoff_ms
        self._maybe_send_fetch(now_ms)

    def _on_fetch_snapshot_response(self, response: FetchSnapshotResponse, now_ms: int) -> None:
        if not self._accept_fetch_answer(response.correlation_id, response.epoch,
                                         response.leader_id, response.error, now_ms):
            return
        pending = self._snapshot_fetch
        if (not response.found or pending is None or pending[0] != response.snapshot_id
                or response.position != len(pending[1])):
            self._snapshot_fetch = None  # the leader moved on: fetch from our log end again
        else:
            pending[1].extend(response.chunk)
            if len(pending[1]) == response.size:
                self._install_snapshot(Snapshot(response.snapshot_id, response.voters,
                                                bytes(pending[1])))
        self._next_fetch_ms = now_ms
        self._maybe_send_fetch(now_ms)

    def _install_snapshot(self, snapshot: Snapshot) -> None:
        end = snapshot.snapshot_id.offset
        if end <= self._applied or end <= self.high_watermark:
            raise InvariantViolation(f"{self.local}: snapshot {snapshot.snapshot_id} is not "
                                     f"ahead of applied {self._applied}")
        self._snapshot_fetch = None
        self._snapshot = snapshot
        self._snapshot_install = snapshot
        self._base_voters = snapshot.voters
        self._log = []
        self._epoch_starts = []
        self._voter_changes = []
        self.log_start_offset = end
        self.high_watermark = self._applied = end
        self._dirty_from = end

    # ---- votes ----------------------------------------------------------------------

    def _candidate_log_is_up_to_date(self, last_epoch: int, log_end_offset: int) -> bool:
        return (last_epoch, log_end_offset) >= (self.last_epoch, self.log_end_offset)

    def _on_vote_request(self, request: VoteRequest, now_ms: int) -> None:
        # KIP-853: whether we (or the candidate) vote is the candidate's view of the voter set,
        # which may be ahead of ours (we may not have fetched the VOTERS entry that added us).
        # What protects the quorum is that the request names our directory id: a wiped
        # node has a new one, and never answers for the voter it was.
        addressed_to_us = request.destination_directory_id == self.local.directory_id
        if not request.pre_vote and addressed_to_us and request.candidate_epoch > self.epoch:
            self._enter_unattached(request.candidate_epoch, now_ms)
        granted = (addressed_to_us
                   and self._candidate_log_is_up_to_date(request.last_epoch, request.log_end_offset)
                   and self._may_grant(request, now_ms))
        if granted and not request.pre_vote:
            self._set_quorum_state(self.epoch, request.source, None)
            self._reset_election_deadline(now_ms)
        self._outbox.append(VoteResponse(self.local, request.source.id, self.epoch, self.leader_id,
                                         request.candidate_epoch, request.pre_vote, granted))

    def _may_grant(self, request: VoteRequest, now_ms: int) -> bool:
        if request.pre_vote:
            if request.candidate_epoch <= self.epoch or self.role is Role.LEADER:
                return False
            return not (self.role is Role.FOLLOWER and not self._leader_resigned
                        and self._last_leader_contact_ms is not None
                        and now_ms - self._last_leader_contact_ms < self.config.fetch_timeout_ms)
        return (request.candidate_epoch == self.epoch and self.leader_id is None
                and self.role in (Role.UNATTACHED, Role.PROSPECTIVE)
                and self.voted_for in (None, request.source))

    def _on_vote_response(self, response: VoteResponse, now_ms: int) -> None:
        if self._maybe_bump_epoch(response.epoch, response.leader_id, now_ms):
            return
        if (self.role is Role.PROSPECTIVE and response.epoch == self.epoch
                and response.leader_id is not None and response.leader_id != self.local.id
                and self.leader_id is None):
            # A leader we did not know of (a hint naming the leader we lost proves nothing:
            # the responder may not have noticed yet).
            self._enter_follower_of(self.epoch, response.leader_id, now_ms)
            return
        expected = Role.PROSPECTIVE if response.pre_vote else Role.CANDIDATE
        candidate_epoch = self.epoch + 1 if response.pre_vote else self.epoch
        if (self.role is expected and response.granted
                and response.candidate_epoch == candidate_epoch):
            self._grants.add(response.source.id)
            self._maybe_win(now_ms)

    # ---- dispatch -------------------------------------------------------------------

    def step(self, message: Message, now_ms: int) -> None:
        """Handle one message addressed to this node."""
        self._check_not_in_flight()
        if isinstance(message, FetchRequest):
            self._on_fetch_request(message, now_ms)
        elif isinstance(message, FetchResponse):
            self._on_fetch_response(message, now_ms)
        elif isinstance(message, VoteRequest):
            self._on_vote_request(message, now_ms)
        elif isinstance(message, VoteResponse):
            self._on_vote_response(message, now_ms)
        elif isinstance(message, BeginQuorumEpoch):
            if (message.destination_directory_id == self.local.directory_id
                    and message.epoch >= self.epoch
                    and not (message.epoch == self.epoch and self.role is Role.FOLLOWER
                             and self.leader_id == message.source.id)):
                self._enter_follower_of(message.epoch, message.source.id, now_ms)
        elif isinstance(message, EndQuorumEpoch):
            if self._maybe_bump_epoch(message.epoch, None, now_ms):
                return
            if (message.epoch == self.epoch and self.role is Role.FOLLOWER
                    and self.leader_id == message.source.id):
                # The leader resigned: grant pre-votes now, and run soon ourselves.
                self._leader_resigned = True
                self._fetch_deadline_ms = min(
                    self._fetch_deadline_ms,
                    now_ms + self._rng.randrange(self.config.election_timeout_ms))
        elif isinstance(message, FetchSnapshotRequest):
            self._on_fetch_snapshot_request(message, now_ms)
        elif isinstance(message, FetchSnapshotResponse):
            self._on_fetch_snapshot_response(message, now_ms)
        else:
            raise InvariantViolation(f"unknown message {message!r}")
