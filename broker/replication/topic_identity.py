"""Which topic incarnation a local replica belongs to, and what the broker does about it.

Pure decisions (no files, no sockets); the replica manager performs them.

Theory of operation (KIP-516). Every topic incarnation has a 16-byte topic ID
from the controller; a log carries the ID of the incarnation it was made for in
``partition.metadata``. A name alone never decides which records a replica
serves: a log whose ID differs from the one the controller names holds another
(deleted) incarnation's records, and is moved aside for deletion, never served
nor replicated from.

LeaderAndIsr naming topic ID ``told`` for a partition whose local log has
``local`` (``log_identity_action``):

===========================  ==============  =========================================
local log                    cluster trusted  action
===========================  ==============  =========================================
none                         any             CREATE an empty log with ``told``
``local == told``            any             KEEP
no ID (made before IDs)      yes             ADOPT: write ``told`` into it
``local != told``            yes             REPLACE: move it aside, create an empty one
no ID, or ``local != told``  no              REFUSE (INCONSISTENT_CLUSTER_ID), keep it
===========================  ==============  =========================================

Before that: a ``told`` that is not 16 bytes or is reserved is INVALID_REQUEST,
and one this broker knows as another topic's ID (``told_id_conflict``) is
INCONSISTENT_TOPIC_ID; either way nothing changes.

"Trusted" (``cluster_id_decision``): the request's cluster ID equals the one in
this data dir's ``meta.properties`` (written the first time one is heard). A
controller whose metadata was wiped starts a new cluster ID: its word may not
delete or replace any log, or adopt one, since its topic IDs say nothing about
the records on this disk.

Stray replicas (``is_stray``): on every UpdateMetadata (a full snapshot) from a
trusted controller, a local replica is stray when the snapshot does not place
its partition on this broker, or names the topic with another ID than the
log's. A log made before topic IDs is judged by placement only. An empty
snapshot is simply "nothing is placed here". A replica that a LeaderAndIsr
made in this process is swept only by a snapshot at least as new as that
LeaderAndIsr (``metadata_offset``): an older one may predate its topic.

StopReplica (delete) removes a log only when the stop names its incarnation
(``stop_replica_error``); a stop recorded before topic IDs (no ID) removes
only a log without one, and a log without one goes with any stop for its name.

Fetch (``fetch_topic_id_error``): a request with a topic ID reads only a
partition of that ID: INCONSISTENT_TOPIC_ID when the leader knows the ID (its
own replica lags or is another incarnation), UNKNOWN_TOPIC_ID when it does not
(the requester's metadata is stale), as Kafka answers.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterable, Mapping, Set

from tidewater.broker.storage.topics import TopicPartition
from tidewater.proto import tidewater_pb2 as pb
from tidewater.proto.errors import InconsistentClusterIdError, InconsistentTopicIdError
from tidewater.proto.topic_id import TOPIC_ID_BYTES, topic_id_to_text


class IdentityAction(enum.Enum):
    CREATE = "create"
    KEEP = "keep"
    ADOPT = "adopt"
    REPLACE = "replace"
    REFUSE = "refuse"


class ClusterCheck(enum.Enum):
    ADOPT = "adopt"  # no cluster ID stored yet: this one becomes the data dir's
    MATCH = "match"
    MISMATCH = "mismatch"
    UNKNOWN = "unknown"  # the request carries none


def cluster_id_decision(stored: str | None, told: str) -> ClusterCheck:
    if not told:
        return ClusterCheck.UNKNOWN
    if stored is None:
        return ClusterCheck.ADOPT
    return ClusterCheck.MATCH if stored == told else ClusterCheck.MISMATCH


def log_identity_action(local_id: bytes | None, told_id: bytes, *, has_log: bool,
                        trusted: bool) -> IdentityAction:
    """The table in the module docstring. ``local_id`` None: the log has no ID yet."""
    if not has_log:
        return IdentityAction.CREATE
    if local_id == told_id:
        return IdentityAction.KEEP
    if not trusted:
        return IdentityAction.REFUSE
    return IdentityAction.ADOPT if local_id is None else IdentityAction.REPLACE


def told_id_conflict(topic: str, told_id: bytes, names_by_id: Mapping[bytes, str]) -> str | None:
    """The other topic ``told_id`` is known to belong to, else None."""
    owner = names_by_id.get(told_id)
    return owner if owner is not None and owner != topic else None


def is_stray(tp: TopicPartition, local_id: bytes | None, *, topic_ids: Mapping[str, bytes],
             placed_here: Set[tuple[str, int]]) -> bool:
    """Does a full snapshot (its topic IDs by name, the partitions it places on this
    broker) leave the local replica ``tp`` with ``local_id`` out?"""
    if (tp.topic, tp.partition) not in placed_here:
        return True
    return local_id is not None and topic_ids.get(tp.topic) != local_id


def stop_replica_error(local_id: bytes | None, told_id: bytes, *,
                       trusted: bool) -> tuple[int, str] | None:
    """Why a deleting StopReplica naming ``told_id`` must not delete a log with ``local_id``.

    A log without an ID may be any incarnation's: a stop for the name removes it (what
    is current would have adopted its ID from a LeaderAndIsr)."""
    if local_id is not None and told_id != local_id:
        return pb.INCONSISTENT_TOPIC_ID, (
            f"StopReplica names incarnation {describe_topic_id(told_id)}, the local log is "
            f"{describe_topic_id(local_id)}: kept")
    if not trusted:
        return pb.INCONSISTENT_CLUSTER_ID, "the controller's cluster id is not this data dir's"
    return None


def fetch_topic_id_error(request_id: bytes, partition_id: bytes,
                         known: Callable[[bytes], bool]) -> tuple[int, str] | None:
    """The error for a fetch naming ``request_id`` from a replica of ``partition_id``, if any."""
    if not request_id or request_id == partition_id:
        return None
    if len(request_id) != TOPIC_ID_BYTES:
        return pb.INVALID_REQUEST, f"topic_id must be {TOPIC_ID_BYTES} bytes, got {len(request_id)}"
    if known(request_id):
        return pb.INCONSISTENT_TOPIC_ID, (
            f"topic id {describe_topic_id(request_id)} is not this replica's "
            f"{describe_topic_id(partition_id)}")
    return pb.UNKNOWN_TOPIC_ID, f"unknown topic id {describe_topic_id(request_id)}"


def describe_topic_id(topic_id: bytes | None) -> str:
    """For messages: the 22-character form, or what is wrong with the value."""
    if not topic_id:
        return "(none)"
    if len(topic_id) != TOPIC_ID_BYTES:
        return f"({len(topic_id)} bytes)"
    return topic_id_to_text(topic_id)


def incarnation_action(tp: TopicPartition, told_id: bytes, local_id: bytes | None, *,
                       has_log: bool, trusted: bool, names_by_id: Mapping[bytes, str]
                       ) -> IdentityAction:
    """What a LeaderAndIsr naming ``told_id`` does to the local replica of ``tp`` (the
    table in the module docstring), or the typed error to answer: INCONSISTENT_TOPIC_ID
    when the ID is known as another topic's, INCONSISTENT_CLUSTER_ID when a controller of
    another cluster would have the log replaced or adopted."""
    owner = told_id_conflict(tp.topic, told_id, names_by_id)
    if owner is not None:
        raise InconsistentTopicIdError(
            f"topic id {describe_topic_id(told_id)} is topic {owner!r}'s, not {tp.topic!r}'s")
    action = log_identity_action(local_id, told_id, has_log=has_log, trusted=trusted)
    if action is IdentityAction.REFUSE:
        raise InconsistentClusterIdError(
            f"{tp}: the local log is incarnation {describe_topic_id(local_id)}, not "
            f"{describe_topic_id(told_id)}, and the controller's cluster id is not this "
            f"data dir's: kept")
    return action


def stray_replicas(local_ids: Mapping[TopicPartition, bytes | None],
                   claimed_at: Mapping[TopicPartition, int], broker_id: int,
                   snapshot_offset: int,
                   partitions: Iterable[tuple[str, int, bytes, Iterable[int]]]
                   ) -> list[TopicPartition]:
    """The local replicas a full snapshot (``partitions``: topic, partition, topic ID,
    replicas; taken at metadata offset ``snapshot_offset``) leaves out (``is_stray``), in
    order. A replica a LeaderAndIsr claimed at a metadata offset newer than the snapshot
    (``claimed_at``) is kept: the snapshot may predate its topic."""
    topic_ids: dict[str, bytes] = {}
    placed_here: set[tuple[str, int]] = set()
    for topic, partition, topic_id, replicas in partitions:
        topic_ids[topic] = topic_id
        if broker_id in replicas:
            placed_here.add((topic, partition))
    return [tp for tp, local_id in sorted(local_ids.items())
            if not snapshot_offset < claimed_at.get(tp, -1)
            and is_stray(tp, local_id, topic_ids=topic_ids, placed_here=placed_here)]
