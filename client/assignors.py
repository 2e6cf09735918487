"""Partition assignors run by a group's leader, and Kafka's ConsumerProtocol bytes.

As in Kafka, the coordinator does not assign: the leader it picks gets every member's
subscription in its JoinGroup answer, assigns with the protocol the group chose, and
sends each member's share in SyncGroup. The bytes are Kafka's ConsumerProtocol v0, so
Tidewater consumers and Kafka's clients can share one group (protocol type
``consumer``, assignor names ``range`` and ``roundrobin``):

* Subscription: version int16 (0), topics: int32 count + int16-length strings,
  user_data: int32-length nullable bytes (-1).
* Assignment: version int16 (0), int32 topic count, per topic: topic string, int32
  partition count + int32 partitions; user_data: int32-length nullable bytes (-1).

Later versions (owned partitions, rack) are read for their v0 fields only.
"""

from __future__ import annotations

from collections.abc import Callable

from tidewater.proto import wire

Members = dict[str, list[str]]  # member id -> subscribed topics
Assignment = dict[str, list[tuple[str, int]]]  # member id -> (topic, partition)


class ProtocolError(ValueError):
    """ConsumerProtocol bytes that do not parse."""


def encode_subscription(topics: list[str]) -> bytes:
    return (wire.I16.pack(0) + wire.I32.pack(len(topics)) + b"".join(wire.string(t) for t in topics)
            + wire.I32.pack(-1))


def encode_assignment(partitions: list[tuple[str, int]]) -> bytes:
    by_topic: dict[str, list[int]] = {}
    for topic, partition in sorted(partitions):
        by_topic.setdefault(topic, []).append(partition)
    out = [wire.I16.pack(0), wire.I32.pack(len(by_topic))]
    for topic, parts in by_topic.items():
        out += [wire.string(topic), wire.I32.pack(len(parts)), *(wire.I32.pack(p) for p in parts)]
    out.append(wire.I32.pack(-1))
    return b"".join(out)


def decode_subscription(raw: bytes) -> list[str]:
    r = wire.WireReader(raw, ProtocolError)
    r.i16()
    return [r.string() for _ in range(r.count())]


def decode_assignment(raw: bytes) -> list[tuple[str, int]]:
    """(topic, partition) pairs; empty bytes (no assignment) give none."""
    if not raw:
        return []
    r = wire.WireReader(raw, ProtocolError)
    r.i16()
    out = []
    for _ in range(r.count()):
        topic = r.string()
        out += [(topic, r.i32()) for _ in range(r.count())]
    return out


def range_assign(members: Members, partition_counts: dict[str, int]) -> Assignment:
    """Kafka's RangeAssignor: per topic, its subscribers in member-id order each take a
    contiguous range; the first ``n % c`` take one more."""
    out: Assignment = {m: [] for m in members}
    for topic in sorted({t for ts in members.values() for t in ts}):
        subscribers = sorted(m for m, ts in members.items() if topic in ts)
        count = partition_counts.get(topic, 0)
        each, extra = divmod(count, len(subscribers))
        start = 0
        for i, member in enumerate(subscribers):
            size = each + (1 if i < extra else 0)
            out[member] += [(topic, p) for p in range(start, start + size)]
            start += size
    return out


def round_robin_assign(members: Members, partition_counts: dict[str, int]) -> Assignment:
    """Kafka's RoundRobinAssignor: every partition in (topic, partition) order to the next
    member (member-id order, cyclic) subscribed to its topic."""
    out: Assignment = {m: [] for m in members}
    ordered = sorted(members)
    position = 0
    for topic in sorted({t for ts in members.values() for t in ts}):
        for partition in range(partition_counts.get(topic, 0)):
            for _ in range(len(ordered)):
                member = ordered[position % len(ordered)]
                position += 1
                if topic in members[member]:
                    out[member].append((topic, partition))
                    break
    return out


ASSIGNORS: dict[str, Callable[[Members, dict[str, int]], Assignment]] = {
    "range": range_assign, "roundrobin": round_robin_assign}
