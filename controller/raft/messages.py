"""The values the Raft core takes in and gives out: voter keys, log entries, messages.

Every message names its ``source`` (the sender's voter key) and its
``destination`` (a node id); the shell routes by id. Requests that only a
particular incarnation of a voter may answer (Vote, BeginQuorumEpoch) also name
the ``destination_directory_id`` the sender believes the voter has (KIP-853):
a node whose disk was wiped has a new directory id and refuses them.
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass, field
from typing import TypeAlias

from tidewater.proto.errors import CorruptRecordError


@dataclass(frozen=True, order=True)
class VoterKey:
    """A replica: node id and the id of its data directory (KIP-853).

    A node whose data directory was wiped starts with a new ``directory_id``: it
    is a different replica, and not the voter it was (it has forgotten its vote)."""

    id: int
    directory_id: str

    def __str__(self) -> str:
        return f"{self.id}/{self.directory_id[:6]}"


class EntryKind(enum.IntEnum):
    """What an entry holds. The numbers are on disk: they never change."""

    DATA = 0  # an application (metadata) record
    LEADER_CHANGE = 1  # appended by a leader at the start of its epoch; data is empty
    VOTERS = 2  # the voter set from this offset on (KIP-853); data is encode_voters()


@dataclass(frozen=True)
class Entry:
    offset: int
    epoch: int
    kind: EntryKind
    data: bytes


@dataclass(frozen=True, order=True)
class OffsetAndEpoch:
    """An end offset (exclusive) and the epoch of the entry before it."""

    offset: int
    epoch: int


SnapshotId: TypeAlias = OffsetAndEpoch


@dataclass(frozen=True)
class Snapshot:
    """The application's state up to ``snapshot_id.offset`` (exclusive), and the voter set
    in force there (the core needs it to know who votes once the log behind is cut)."""

    snapshot_id: SnapshotId
    voters: frozenset[VoterKey]
    data: bytes


def encode_voters(voters: frozenset[VoterKey]) -> bytes:
    """A VOTERS entry's data: ``id:directory_id`` pairs joined by commas, ids ascending."""
    return ",".join(f"{v.id}:{v.directory_id}" for v in sorted(voters)).encode()


class MalformedVotersError(CorruptRecordError):
    """A VOTERS entry's data that is not ``encode_voters``' (found by make fuzz: bytes
    that are not ASCII, an id that is no int32, a directory id that is not 16 bytes of
    hex, which the quorum-state and snapshot files could not hold)."""


_VOTER = re.compile(r"(0|[1-9][0-9]{0,9}):([0-9a-fA-F]{32})")
_NODE_ID_MAX = 2**31 - 1


def decode_voters(data: bytes) -> frozenset[VoterKey]:
    """The voter set of a VOTERS entry; MalformedVotersError for what ``encode_voters``
    does not write."""
    try:
        text = data.decode("ascii")
    except UnicodeDecodeError:
        raise MalformedVotersError(f"voters {data[:64]!r} are not ASCII") from None
    voters = set()
    for part in text.split(","):
        match = _VOTER.fullmatch(part)
        if match is None or int(match[1]) > _NODE_ID_MAX:
            raise MalformedVotersError(f"malformed voter {part[:80]!r}")
        voters.add(VoterKey(int(match[1]), match[2]))
    return frozenset(voters)


@dataclass(frozen=True)
class VoteRequest:
    """A candidate asks for a vote (``pre_vote``: would you vote for me, KIP-996).

    ``candidate_epoch`` is the epoch the candidate runs in; for a pre-vote it is the
    prospective's epoch + 1, and nobody changes epoch on receiving it."""

    source: VoterKey
    destination: int
    destination_directory_id: str
    candidate_epoch: int
    last_epoch: int
    log_end_offset: int
    pre_vote: bool


@dataclass(frozen=True)
class VoteResponse:
    source: VoterKey
    destination: int
    epoch: int  # the responder's epoch after handling the request
    leader_id: int | None  # the responder's leader in ``epoch``, if it knows one
    candidate_epoch: int  # echoed from the request
    pre_vote: bool
    granted: bool


@dataclass(frozen=True)
class BeginQuorumEpoch:
    """The leader of ``epoch`` announces itself; resent until the voter fetches."""

    source: VoterKey
    destination: int
    destination_directory_id: str
    epoch: int


@dataclass(frozen=True)
class EndQuorumEpoch:
    """The leader of ``epoch`` resigns: followers need not wait out the fetch timeout."""

    source: VoterKey
    destination: int
    epoch: int


class FetchError(enum.Enum):
    NONE = "none"
    NOT_LEADER = "not_leader"  # the responder does not lead; leader_id/epoch say who might
    FENCED_LEADER_EPOCH = "fenced_leader_epoch"  # the fetcher's epoch is older
    UNKNOWN_LEADER_EPOCH = "unknown_leader_epoch"  # the fetcher's epoch is newer


@dataclass(frozen=True)
class FetchRequest:
    """KIP-595 fetch: the follower's log end and the epoch of its last entry."""

    source: VoterKey
    destination: int
    epoch: int
    fetch_offset: int
    last_fetched_epoch: int
    correlation_id: int


@dataclass(frozen=True)
class FetchResponse:
    """At most one of ``entries``, ``diverging`` and ``snapshot_id`` is set.

    ``diverging``: the follower's log differs from the leader's; truncate to at most
    that end offset and fetch again. ``snapshot_id``: the fetch offset lies behind the
    leader's log start; fetch that snapshot."""

    source: VoterKey
    destination: int
    epoch: int
    leader_id: int | None
    correlation_id: int
    error: FetchError
    high_watermark: int = 0
    entries: tuple[Entry, ...] = ()
    diverging: OffsetAndEpoch | None = None
    snapshot_id: SnapshotId | None = None


@dataclass(frozen=True)
class FetchSnapshotRequest:
    """KIP-630: a chunk of the leader's snapshot ``snapshot_id`` from ``position``."""

    source: VoterKey
    destination: int
    epoch: int
    snapshot_id: SnapshotId
    position: int
    correlation_id: int


@dataclass(frozen=True)
class FetchSnapshotResponse:
    """``chunk`` is the snapshot's bytes from ``position``; ``size`` is the whole length.
    ``found`` is false when the leader no longer has that snapshot (fetch again)."""

    source: VoterKey
    destination: int
    epoch: int
    leader_id: int | None
    correlation_id: int
    error: FetchError
    snapshot_id: SnapshotId
    found: bool = False
    position: int = 0
    size: int = 0
    voters: frozenset[VoterKey] = field(default_factory=frozenset)
    chunk: bytes = b""


Message: TypeAlias = (VoteRequest | VoteResponse | BeginQuorumEpoch | EndQuorumEpoch
                      | FetchRequest | FetchResponse | FetchSnapshotRequest
                      | FetchSnapshotResponse)
