"""A seeded simulation of the controller quorum: the product's RaftNode on a fake network,
fake disks and a fake clock.

The simulator owns only the world: messages (loss, delay hence reordering,
duplication, partitions), disks (a failed write keeps a random prefix of what
the Ready asked for, then the node stops), crashes (a node stops between any
two steps of carrying out a Ready, so what it had not made durable is lost),
wiped disks (the node comes back with a new directory id: KIP-853) and the
clock. An operator replaces a wiped voter through the log (RemoveVoter, then
AddVoter once the new incarnation caught up). Nodes take snapshots, and a
lagging or wiped node catches up from the leader's snapshot.

Checked after every step (``RaftChecker``):

* **election safety**: at most one node leads an epoch;
* **log matching**: two logs with an entry of the same (offset, epoch) hold the
  same entries up to it (a chain hash per durable entry);
* **leader completeness**: a node that becomes leader holds every committed entry;
* **state machine safety**: every node applies the same entries in the same
  order (a snapshot is checked against the committed prefix it claims);
* **no committed entry is lost**: at the end the faults stop, every node
  restarts and all must apply at least every entry ever committed (a lost
  entry shows up as a different entry applied at its offset).

Reproduce one seed: ``cd tests && ../.venv/bin/python -m sim.raft_run --seed N --verbose``.
"""

from __future__ import annotations

import hashlib
import heapq
import random
from dataclasses import dataclass, field

from tidewater.controller.raft import (
    Entry,
    EntryKind,
    Message,
    NotLeaderError,
    ProposalRejectedError,
    QuorumState,
    RaftConfig,
    RaftNode,
    Ready,
    Role,
    Snapshot,
    VoterKey,
)
from tidewater.controller.raft.messages import FetchRequest, VoteResponse, decode_voters
from tidewater.proto.errors import InvariantViolation

READY_ROUNDS_MAX = 20  # a node that still has a Ready after this many rounds is looping


class RaftSimulationFailure(Exception):
    def __init__(self, seed: int, step: int, cause: BaseException, trace: list[str]):
        self.seed, self.step, self.cause = seed, step, cause
        tail = "\n".join(trace[-40:])
        super().__init__(f"seed {seed} step {step}: {type(cause).__name__}: {cause}\n"
                         f"last trace lines:\n{tail}")


@dataclass(frozen=True)
class RaftSimConfig:
    nodes: int = 3
    steps: int = 3000
    quiet_steps_max: int = 3000  # the closing fault-free period must converge within this
    step_ms_max: int = 40
    loss_probability: float = 0.05
    duplicate_probability: float = 0.03
    delay_ms_min: int = 1
    delay_ms_max: int = 60
    crash_probability: float = 0.004  # per step
    crash_mid_ready_probability: float = 0.002  # per Ready: stop between persist and send
    down_ms_max: int = 3000
    wipe_probability: float = 0.25  # of a crash: the data directory is lost
    disk_failure_probability: float = 0.002  # per Ready that writes
    partition_probability: float = 0.003
    partition_ms_max: int = 5000
    propose_probability: float = 0.3
    snapshot_probability: float = 0.005
    remove_voter_probability: float = 0.003  # per leader step: shrink, to grow back later
    # Broken variant: a wiped node keeps its directory id, i.e. it is taken for the
    # voter it was although it forgot its vote.
    wipe_keeps_directory_id: bool = False
    # request_timeout_ms above the longest round trip (2 x delay_ms_max): a fetch answered
    # after its timeout is discarded, so a shorter one would starve followers.
    raft: RaftConfig = RaftConfig(fetch_timeout_ms=1000, election_timeout_ms=400,
                                  fetch_backoff_ms=20, request_timeout_ms=450,
                                  begin_quorum_resend_ms=150, fetch_entries_max=3,
                                  uncommitted_entries_max=24,
                                  snapshot_chunk_bytes_max=8, voter_catch_up_lag_max=4)


def random_config(rng: random.Random, **overrides: object) -> RaftSimConfig:
    """Each seed draws its own weather: some calm, some stormy."""
    base = RaftSimConfig(
        nodes=rng.choice((3, 3, 5)),
        loss_probability=rng.choice((0.0, 0.02, 0.1, 0.2)),
        duplicate_probability=rng.choice((0.0, 0.05)),
        delay_ms_max=rng.choice((10, 60, 200)),
        crash_probability=rng.choice((0.001, 0.004, 0.01)),
        wipe_probability=rng.choice((0.0, 0.2, 0.5)),
        disk_failure_probability=rng.choice((0.0, 0.002, 0.01)),
        partition_probability=rng.choice((0.0, 0.003, 0.01)),
        snapshot_probability=rng.choice((0.0, 0.005, 0.02)),
    )
    return RaftSimConfig(**{**base.__dict__, **overrides})  # type: ignore[arg-type]


def chain_hash(previous: int, entry: Entry) -> int:
    # Not hash(): bytes hash differently under each PYTHONHASHSEED, and the hash lands in
    # snapshot data, whose size decides how many chunks (messages, random draws) follow.
    digest = hashlib.blake2b(b"%d %d %d %d " % (previous, entry.offset, entry.epoch, entry.kind)
                             + entry.data, digest_size=8).digest()
    return int.from_bytes(digest, "big")


@dataclass
class SimDisk:
    """One node's data directory: what survives a crash."""

    node_id: int
    directory_id: str
    quorum_state: QuorumState = QuorumState()
    snapshot: Snapshot | None = None
    log: list[Entry] = field(default_factory=list)  # from the snapshot's end (or 0)
    # The voters written at format time; None: the cluster's initial controllers. A wiped
    # disk is formatted either way: with them and a new directory id, or with none
    # (--no-initial-controllers: an observer that asks the bootstrap servers who leads).
    bootstrap_voters: frozenset[VoterKey] | None = None

    @property
    def log_start_offset(self) -> int:
        return self.snapshot.snapshot_id.offset if self.snapshot else 0


@dataclass
class AppState:
    """The application: the chain hash of every entry applied, in order."""

    applied_end: int = 0
    applied_hash: int = 0

    def encode(self) -> bytes:
        return f"{self.applied_end}:{self.applied_hash}".encode()

    @staticmethod
    def decode(data: bytes) -> AppState:
        end, _, value = data.decode().partition(":")
        return AppState(int(end), int(value))


class RaftChecker:
    def __init__(self) -> None:
        self.leader_of_epoch: dict[int, int] = {}
        self.committed: list[Entry] = []
        self.committed_hash: list[int] = [0]  # committed_hash[n]: chain over committed[:n]
        self.chain_of: dict[tuple[int, int], int] = {}  # (offset, epoch) -> chain hash
        self.leaders_checked: set[tuple[int, int]] = set()

    def fail(self, message: str) -> None:
        raise InvariantViolation(message)

    def on_durable_append(self, node_id: int, entry: Entry, chain: int) -> None:
        key = (entry.offset, entry.epoch)
        known = self.chain_of.setdefault(key, chain)
        if known != chain:
            self.fail(f"log matching: node {node_id} holds {entry.offset}@{entry.epoch} after "
                      f"a different history than another node")

    def on_leader(self, node_id: int, node: RaftNode) -> None:
        known = self.leader_of_epoch.setdefault(node.epoch, node_id)
        if known != node_id:
            self.fail(f"election safety: nodes {known} and {node_id} both lead epoch {node.epoch}")
        if (node_id, node.epoch) in self.leaders_checked:
            return
        self.leaders_checked.add((node_id, node.epoch))
        start = node.log_start_offset
        if start > len(self.committed):
            self.fail(f"leader completeness: leader {node_id} of epoch {node.epoch} starts its "
                      f"log at {start}, past the {len(self.committed)} committed entries")
        for entry, mine in zip(self.committed[start:], node.entries(start, len(self.committed)),
                               strict=False):
            if entry != mine:
                self.fail(f"leader completeness: leader {node_id} of epoch {node.epoch} has "
                          f"{mine} where {entry} was committed")
        if node.log_end_offset < len(self.committed):
            self.fail(f"leader completeness: leader {node_id} of epoch {node.epoch} ends at "
                      f"{node.log_end_offset}; {len(self.committed)} entries are committed")

    def on_apply(self, node_id: int, app: AppState, entry: Entry) -> None:
        if entry.offset != app.applied_end:
            self.fail(f"node {node_id} applies {entry.offset} after {app.applied_end}")
        if entry.offset < len(self.committed):
            if self.committed[entry.offset] != entry:
                self.fail(f"state machine safety: node {node_id} applies {entry}; "
                          f"{self.committed[entry.offset]} was committed at that offset")
        else:
            self.committed.append(entry)
            self.committed_hash.append(chain_hash(self.committed_hash[-1], entry))
        app.applied_end += 1
        app.applied_hash = chain_hash(app.applied_hash, entry)

    def check_snapshot(self, node_id: int, snapshot: Snapshot) -> None:
        state = AppState.decode(snapshot.data)
        end = snapshot.snapshot_id.offset
        if state.applied_end != end or end > len(self.committed):
            self.fail(f"node {node_id}: snapshot {snapshot.snapshot_id} holds {state}")
        if self.committed_hash[end] != state.applied_hash:
            self.fail(f"state machine safety: node {node_id}'s snapshot {snapshot.snapshot_id} "
                      f"is not the committed history")
        if end and self.committed[end - 1].epoch != snapshot.snapshot_id.epoch:
            self.fail(f"node {node_id}: snapshot {snapshot.snapshot_id} names the wrong epoch")


@dataclass
class RaftSimResult:
    seed: int
    steps: int = 0
    committed: int = 0
    elections: int = 0
    crashes: int = 0
    wipes: int = 0
    disk_failures: int = 0
    partitions: int = 0
    snapshots_taken: int = 0
    snapshots_installed: int = 0
    voter_changes: int = 0
    messages_sent: int = 0
    messages_dropped: int = 0


class RaftSimulation:
    def __init__(self, seed: int, config: RaftSimConfig | None = None, *,
                 node_class: type[RaftNode] = RaftNode, verbose: bool = False):
        self.seed = seed
        self.rng = random.Random(seed)
        self.config = config if config is not None else random_config(self.rng)
        self.node_class = node_class
        self.verbose = verbose
        self.now_ms = 0
        self.step_number = 0
        self.trace: list[str] = []
        self.checker = RaftChecker()
        self.result = RaftSimResult(seed)
        ids = list(range(1, self.config.nodes + 1))
        self.disks = {i: SimDisk(i, self._new_directory_id()) for i in ids}
        self.bootstrap_voters = frozenset(VoterKey(i, d.directory_id) for i, d in self.disks.items())
        self.nodes: dict[int, RaftNode | None] = {}
        self.apps: dict[int, AppState] = {}
        self.chains: dict[int, list[int]] = {}  # per disk: chain hash at log_start + i + 1
        self.down_until_ms: dict[int, int] = {}
        self.queue: list[tuple[int, int, Message]] = []
        self.sequence = 0
        self.cut_until_ms: dict[tuple[int, int], int] = {}
        self.proposed = 0
        self.faults_on = True
        for i in ids:
            self.chains[i] = []
            self._start(i)

    def _new_directory_id(self) -> str:
        return f"{self.rng.getrandbits(128):032x}"

    def log(self, text: str) -> None:
        line = f"{self.now_ms:>8} {text}"
        self.trace.append(line)
        if len(self.trace) > 400:
            del self.trace[:200]
        if self.verbose:
            print(line)

    # ---- nodes ----------------------------------------------------------------------

    def _start(self, node_id: int) -> None:
        disk = self.disks[node_id]
        node = self.node_class(
            self.config.raft, VoterKey(node_id, disk.directory_id),
            random.Random(self.rng.getrandbits(64)), self.now_ms,
            bootstrap_voters=self._formatted_voters(disk), quorum_state=disk.quorum_state,
            snapshot=disk.snapshot, entries=list(disk.log),
            bootstrap_servers=frozenset(self.disks))
        self.nodes[node_id] = node
        self.apps[node_id] = (AppState.decode(disk.snapshot.data) if disk.snapshot else AppState())
        self.log(f"node {node_id} starts as {node.local}, {node.role.value} in epoch {node.epoch}, "
                 f"log [{disk.log_start_offset}, {node.log_end_offset})")

    def _crash(self, node_id: int, why: str) -> None:
        self.nodes[node_id] = None
        self.result.crashes += 1
        self.down_until_ms[node_id] = self.now_ms + self.rng.randint(1, self.config.down_ms_max)
        if self.rng.random() < self.config.wipe_probability and self._may_wipe(node_id):
            old = self.disks[node_id]
            directory_id = (old.directory_id if self.config.wipe_keeps_directory_id
                            else self._new_directory_id())
            # Half the new directories are formatted without initial controllers (decided
            # by the id's last bit: no extra draw, so seeds keep their other choices).
            no_initial = (not self.config.wipe_keeps_directory_id
                          and int(directory_id[-1], 16) % 2 == 1)
            self.disks[node_id] = SimDisk(node_id, directory_id,
                                          bootstrap_voters=frozenset() if no_initial else None)
            self.chains[node_id] = []
            self.result.wipes += 1
            why += ", disk wiped"
        self.log(f"node {node_id} stops ({why})")

    def _may_wipe(self, node_id: int) -> bool:
        # Losing a majority of the voters' disks loses data in any Raft, and so can losing
        # one while a voter change is in flight: as a careful operator, wipe a disk only
        # while every disk's voter set (committed or not) is all nodes' current incarnations.
        if self.config.wipe_keeps_directory_id:
            return True
        current = {VoterKey(i, d.directory_id) for i, d in self.disks.items()}
        return all(self._disk_voters(disk) == current for disk in self.disks.values())

    def _disk_voters(self, disk: SimDisk) -> frozenset[VoterKey]:
        for entry in reversed(disk.log):
            if entry.kind is EntryKind.VOTERS:
                return decode_voters(entry.data)
        return disk.snapshot.voters if disk.snapshot else self._formatted_voters(disk)

    def _formatted_voters(self, disk: SimDisk) -> frozenset[VoterKey]:
        return self.bootstrap_voters if disk.bootstrap_voters is None else disk.bootstrap_voters

    def _carry_out(self, node_id: int, node: RaftNode) -> None:
        for _ in range(READY_ROUNDS_MAX):
            if self.nodes[node_id] is not node or not node.has_ready():
                return
            ready = node.ready()
            if not self._persist(node_id, ready):
                return
            if self.faults_on and self.rng.random() < self.config.crash_mid_ready_probability:
                self._crash(node_id, "after persisting, before sending")
                return
            for message in ready.send:
                self._check_durable_before_sent(node_id, message)
                self._send(node_id, message)
            app = self.apps[node_id]
            for entry in ready.committed:
                self.checker.on_apply(node_id, app, entry)
            node.advance(ready, self.now_ms)
        raise InvariantViolation(f"node {node_id} still has a Ready after {READY_ROUNDS_MAX} rounds")

    def _persist(self, node_id: int, ready: Ready) -> bool:
        """Write the Ready's durable part; False if the disk failed (the node then stops)."""
        disk = self.disks[node_id]
        writes = bool(ready.snapshot_write or ready.snapshot_install or ready.log_append
                      or ready.log_truncate_to is not None or ready.quorum_state is not None)
        fail_at = -1
        if writes and self.faults_on and self.rng.random() < self.config.disk_failure_probability:
            fail_at = self.rng.randint(0, 4)
            self.result.disk_failures += 1
        chain = self.chains[node_id]
        for step in range(5):
            if step == fail_at:
                self._crash(node_id, f"disk write failed at step {step}")
                return False
            if step == 0 and ready.snapshot_write is not None:
                snapshot = ready.snapshot_write
                self.checker.check_snapshot(node_id, snapshot)
                cut = snapshot.snapshot_id.offset - disk.log_start_offset
                disk.snapshot = snapshot
                del disk.log[:cut]
                del chain[:cut]
                self.result.snapshots_taken += 1
            elif step == 1 and ready.snapshot_install is not None:
                snapshot = ready.snapshot_install
                self.checker.check_snapshot(node_id, snapshot)
                disk.snapshot = snapshot
                disk.log.clear()
                chain.clear()
                self.apps[node_id] = AppState.decode(snapshot.data)
                self.result.snapshots_installed += 1
                self.log(f"node {node_id} installs snapshot {snapshot.snapshot_id}")
            elif step == 2 and ready.log_truncate_to is not None:
                keep = ready.log_truncate_to - disk.log_start_offset
                if keep < len(disk.log):
                    self.log(f"node {node_id} truncates its log to {ready.log_truncate_to}")
                del disk.log[keep:]
                del chain[keep:]
            elif step == 3 and ready.log_append:
                entries = ready.log_append
                if fail_at == 4 and self.rng.random() < 0.5:
                    # a torn write: a prefix reached the disk
                    entries = entries[:self.rng.randint(0, len(entries))]
                for entry in entries:
                    if entry.offset != disk.log_start_offset + len(disk.log):
                        raise InvariantViolation(f"node {node_id}: append of {entry.offset} at "
                                                 f"{disk.log_start_offset + len(disk.log)}")
                    previous = chain[-1] if chain else self._base_chain(disk)
                    chain.append(chain_hash(previous, entry))
                    disk.log.append(entry)
                    self.checker.on_durable_append(node_id, entry, chain[-1])
            elif step == 4 and ready.quorum_state is not None:
                disk.quorum_state = ready.quorum_state
        return True

    def _check_durable_before_sent(self, node_id: int, message: Message) -> None:
        """What a message claims must already be on the sender's disk."""
        disk = self.disks[node_id]
        if isinstance(message, VoteResponse) and message.granted and not message.pre_vote:
            state = disk.quorum_state
            if state.epoch < message.candidate_epoch or (
                    state.epoch == message.candidate_epoch
                    and (state.voted_for is None or state.voted_for.id != message.destination)):
                raise InvariantViolation(f"node {node_id} grants epoch {message.candidate_epoch} "
                                         f"to {message.destination}; its disk says {state}")
        if isinstance(message, FetchRequest):
            durable_end = disk.log_start_offset + len(disk.log)
            if message.fetch_offset > durable_end:
                raise InvariantViolation(f"node {node_id} fetches from {message.fetch_offset}; "
                                         f"its disk ends at {durable_end}")

    @staticmethod
    def _base_chain(disk: SimDisk) -> int:
        return AppState.decode(disk.snapshot.data).applied_hash if disk.snapshot else 0

    # ---- network --------------------------------------------------------------------

    def _cut(self, a: int, b: int) -> bool:
        return self.cut_until_ms.get((min(a, b), max(a, b)), 0) > self.now_ms

    def _send(self, source: int, message: Message) -> None:
        self.result.messages_sent += 1
        destination = message.destination
        copies = 2 if self.rng.random() < self.config.duplicate_probability else 1
        for _ in range(copies):
            if self._cut(source, destination) or self.rng.random() < self.config.loss_probability:
                self.result.messages_dropped += 1
                continue
            self.sequence += 1
            deliver_ms = self.now_ms + self.rng.randint(self.config.delay_ms_min,
                                                        self.config.delay_ms_max)
            heapq.heappush(self.queue, (deliver_ms, self.sequence, message))

    def _deliver(self) -> None:
        while self.queue and self.queue[0][0] <= self.now_ms:
            _, _, message = heapq.heappop(self.queue)
            node = self.nodes.get(message.destination)
            if node is None or self._cut(message.source.id, message.destination):
                self.result.messages_dropped += 1
                continue
            node.step(message, self.now_ms)

    # ---- the run --------------------------------------------------------------------

    def run(self) -> RaftSimResult:
        try:
            for _ in range(self.config.steps):
                self._step(faults=True)
            self._quiet_period()
        except (InvariantViolation, AssertionError) as cause:
            raise RaftSimulationFailure(self.seed, self.step_number, cause, self.trace) from cause
        self.result.committed = len(self.checker.committed)
        self.result.elections = len(self.checker.leader_of_epoch)
        return self.result

    def _quiet_period(self) -> None:
        """Faults stop, everyone restarts: every node must apply every committed entry."""
        self.faults_on = False
        self.cut_until_ms.clear()
        for node_id, node in self.nodes.items():
            if node is None:
                self.down_until_ms[node_id] = self.now_ms
        target = len(self.checker.committed)
        for _ in range(self.config.quiet_steps_max):
            self._step(faults=False)
            if self._converged(target):
                return
        states = {i: (n.role.value, n.epoch, n.high_watermark, n.log_end_offset) if n else None
                  for i, n in self.nodes.items()}
        raise InvariantViolation(f"no convergence after the faults stopped: {target} entries "
                                 f"committed, nodes {states}, applied "
                                 f"{ {i: a.applied_end for i, a in self.apps.items()} }")

    def _converged(self, target: int) -> bool:
        leaders = [n for n in self.nodes.values() if n is not None and n.is_leader]
        if len(leaders) != 1 or any(n is None for n in self.nodes.values()):
            return False
        leader = leaders[0]
        if leader.high_watermark <= target or not any(
                e.epoch == leader.epoch for e in self.checker.committed[-1:]):
            self._propose(leader)  # a committed entry of the last epoch shows nothing was lost
            return False
        members = {v.id for v in leader.voters}
        return all(self.apps[i].applied_end >= target for i in members)

    def _step(self, *, faults: bool) -> None:
        self.step_number += 1
        self.result.steps += 1
        self.now_ms += self.rng.randint(1, self.config.step_ms_max)
        for node_id, until in list(self.down_until_ms.items()):
            if until <= self.now_ms:
                del self.down_until_ms[node_id]
                self._start(node_id)
        self._deliver()
        for node in self.nodes.values():
            if node is not None:
                node.tick(self.now_ms)
        if faults:
            self._faults()
        self._operate()
        for node_id, node in list(self.nodes.items()):
            if node is not None:
                self._carry_out(node_id, node)
        for node_id, node in self.nodes.items():
            if node is not None and node.role is Role.LEADER:
                if (node_id, node.epoch) not in self.checker.leaders_checked:
                    self.log(f"node {node_id} leads epoch {node.epoch}, log end "
                             f"{node.log_end_offset}, voters "
                             f"{sorted(str(v) for v in node.voters)}")
                self.checker.on_leader(node_id, node)

    def _faults(self) -> None:
        rng, config = self.rng, self.config
        live = [i for i, n in self.nodes.items() if n is not None]
        if live and rng.random() < config.crash_probability:
            self._crash(rng.choice(live), "crash")
        if rng.random() < config.partition_probability:
            ids = sorted(self.nodes)
            side = set(rng.sample(ids, rng.randint(1, len(ids) // 2)))
            until = self.now_ms + rng.randint(100, config.partition_ms_max)
            for a in side:
                for b in ids:
                    if b not in side:
                        key = (min(a, b), max(a, b))
                        self.cut_until_ms[key] = max(self.cut_until_ms.get(key, 0), until)
            self.result.partitions += 1
            self.log(f"partition {sorted(side)} from the rest until {until}")

    def _operate(self) -> None:
        """Clients propose on whoever leads; the operator snapshots and replaces voters."""
        rng = self.rng
        for node_id, node in self.nodes.items():
            if node is None:
                continue
            if node.is_leader and rng.random() < self.config.propose_probability:
                self._propose(node)
            if node.is_leader and rng.random() < 0.05:
                self._maybe_replace_voter(node_id, node)
            if (rng.random() < self.config.snapshot_probability
                    and self.apps[node_id].applied_end > node.log_start_offset):
                node.compact(self.apps[node_id].encode(), self.now_ms)
                self.log(f"node {node_id} snapshots at {self.apps[node_id].applied_end}")

    def _propose(self, node: RaftNode) -> None:
        records = [f"r{self.proposed + i}".encode() for i in range(self.rng.randint(1, 3))]
        try:
            node.propose(records, self.now_ms)
            self.proposed += len(records)
        except (NotLeaderError, ProposalRejectedError):
            pass

    def _maybe_replace_voter(self, node_id: int, leader: RaftNode) -> None:
        # KIP-853 by hand, as an operator would: remove the wiped incarnation, then add
        # the node's current one once it caught up.
        current = {i: VoterKey(i, d.directory_id) for i, d in self.disks.items()}
        stale = [v for v in sorted(leader.voters) if current[v.id] != v]
        missing = [k for i, k in sorted(current.items())
                   if all(v.id != i for v in leader.voters)]
        try:
            if stale:
                leader.change_voters(remove=stale[0], now_ms=self.now_ms)
                self.log(f"leader {node_id} removes voter {stale[0]}")
            elif missing:
                leader.change_voters(add=missing[0], now_ms=self.now_ms)
                self.log(f"leader {node_id} adds voter {missing[0]}")
            elif (len(leader.voters) == self.config.nodes
                  and self.rng.random() < self.config.remove_voter_probability / 0.05):
                # a healthy voter, perhaps the leader itself (it resigns once committed)
                victim = self.rng.choice(sorted(leader.voters))
                leader.change_voters(remove=victim, now_ms=self.now_ms)
                self.log(f"leader {node_id} removes healthy voter {victim}")
            else:
                return
            self.result.voter_changes += 1
        except (NotLeaderError, ProposalRejectedError):
            pass
