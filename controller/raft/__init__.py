"""The controller quorum's Raft (KRaft semantics: KIP-595, KIP-630, KIP-853, KIP-996).

What the controller uses (the rest is internal):

* ``RaftNode(config, local, rng, now_ms, bootstrap_voters=..., quorum_state=...,
  snapshot=..., entries=...)``: built from what ``storage.RaftStorage.open``
  recovered. ``local`` is ``VoterKey(node id, directory id)``; the directory id
  is created when the data directory is formatted and lives in its quorum-state
  file: a wiped directory gets a new one and is not the voter it replaces.
* Inputs: ``step(message, now_ms)``, ``tick(now_ms)``,
  ``propose(records, now_ms) -> first offset`` (raises ``NotLeaderError``,
  ``ProposalRejectedError``; both retriable), ``change_voters(add=|remove=)``
  (KIP-853, one at a time), ``compact(image_bytes, now_ms)`` (a snapshot of
  everything applied so far).
* Output: while ``has_ready()``: ``ready()`` -> ``Ready``; carry it out in field
  order (snapshot, truncate, append, quorum state, all durable; then send; then
  apply ``committed`` entries of kind DATA in order; a ``snapshot_install``
  replaces the application's image first), then ``advance(ready, now_ms)``. A
  failed write: stop, restart from disk; never ``advance``.
* State: ``is_leader``, ``leader_id``, ``epoch``, ``high_watermark``,
  ``describe(now_ms)`` (leader, epoch, high watermark, each replica's log end
  and lag: ``describe --status --replication``).

Modules: ``messages`` (keys, entries, wire messages), ``node`` (the state
machine, its theory of operation), ``storage`` (the durable log and quorum
state), ``snapshot_file`` (the snapshot format).

Between processes it runs in ``controller/quorum/`` (the asyncio shell, the gRPC
transport, ``python -m tidewater.controller.quorum``); that package's docstring
lists what is left to move the metadata owner onto it. ``tide dump-log`` reads
these files (``tools/commands/dump_raft.py``).
"""

from tidewater.controller.raft.messages import (
    Entry,
    EntryKind,
    Message,
    OffsetAndEpoch,
    Snapshot,
    SnapshotId,
    VoterKey,
)
from tidewater.controller.raft.node import (
    NotLeaderError,
    ProposalRejectedError,
    QuorumDescription,
    QuorumState,
    RaftConfig,
    RaftNode,
    Ready,
    Role,
)

__all__ = [
    "Entry", "EntryKind", "Message", "NotLeaderError", "OffsetAndEpoch", "ProposalRejectedError",
    "QuorumDescription", "QuorumState", "RaftConfig", "RaftNode", "Ready", "Role", "Snapshot",
    "SnapshotId", "VoterKey",
]
