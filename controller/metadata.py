"""The controller's metadata image and the records that change it.

``ClusterMetadata.apply(offset, record)`` is the only way the image changes,
both when the log is replayed at start-up and at run time, so the two can
never disagree. Records are plain JSON objects (see ``metadata_log`` for the
framing); their ``type`` and fields:

======================  ==========================================================
type                    fields
======================  ==========================================================
cluster                 cluster_id (first record of a new log)
controller_epoch        epoch (one per controller start)
broker_registered       broker_id, incarnation_id, listeners [[name, host, port]],
                        optional broker_epoch (else the record's offset), optional
                        control_token (hex; older records have none), optional
                        rack (broker.rack; older records and rackless brokers have
                        none); unfenced
broker_fenced           broker_id
broker_unfenced         broker_id
topic_created           name, topic_id (22-char base64url, see below), configs
                        {str: str}, partitions [{partition, replicas, isr, leader,
                        optional leader_epoch and partition_epoch (else 0),
                        optional adding_replicas, removing_replicas}]
partitions_created      name, partitions [{partition, replicas, isr, leader}]: new
                        partitions of an existing topic, numbered on from its last
partition_changed       topic, partition, leader, isr, leader_epoch,
                        partition_epoch, unclean (bool), optional replicas,
                        adding_replicas, removing_replicas (a reassignment, KIP-455:
                        absent in older records, which keep the replicas as they were)
topic_deleted           name, optional pending_stops {broker_id: [partition]}: the
                        fenced replicas that still need a StopReplica
pending_stops_cleared   broker_id (its pending StopReplicas were handed to a sender)
pending_stops           broker_id, partitions [[topic, partition, topic_id]]
                        (snapshots; older ones without the topic_id)
counters                unclean_elections_total, topics_created_total (snapshots)
configs_altered         resource_type (2 topic, 4 broker), name, configs {str: str}:
                        the resource's whole new own configs (``config_changes``;
                        broker name "" is the cluster-wide default)
scram_credential,       users' SCRAM credentials and ACLs: see ``security_records``
client_quota,           client quotas: see ``quota_records``
scram_credential_deleted,
acl_created, acl_deleted
======================  ==========================================================

Topic IDs (KIP-516): each topic incarnation has a 16-byte ID, made at random by
``CreateTopics`` and written in its ``topic_created`` record. A
``topic_created`` record written before topic IDs existed has none: replay
gives it ``legacy_topic_id(cluster_id, name, offset)``, a hash of the
cluster, the name and the record's offset. Deterministic rather than a new
random ID written once at start-up because replay must not append: every
replay of the same log gives the same ID (brokers, which keep the ID in each
partition directory, never see it change), and the offset makes it unique per
incarnation (offsets only grow, across restarts and compactions). Compaction
then writes the ID explicitly, so it survives the offset moving.

``snapshot_records()`` describes the whole image with these records (explicit
epochs included); replaying them gives back an equal image. Compaction
rewrites the log with them.

Broker sessions (last heartbeat, controlled shutdown) are not metadata: they
live in ``sessions.BrokerSessions`` and start fresh with every controller.

``poison(cause)`` is the owner's last act when the image got ahead of the log
(a failed write, a command that failed after appending): from then on every
read of the image raises ``ImagePoisonedError``, so no request, answer or log
replay can be built from records that may never reach the disk.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterator, KeysView
from dataclasses import dataclass, field, replace
from typing import Any

from tidewater.controller.election import PartitionRecord
from tidewater.controller.metadata_log import MetadataRecord
from tidewater.controller.quota_records import RECORD_TYPES as QUOTA_RECORD_TYPES
from tidewater.controller.quota_records import QuotaImage
from tidewater.controller.security_records import RECORD_TYPES as SECURITY_RECORD_TYPES
from tidewater.controller.security_records import SecurityImage
from tidewater.proto.errors import CorruptFileError
from tidewater.proto.topic_id import is_valid_topic_id, topic_id_from_text, topic_id_to_text


@dataclass(frozen=True, slots=True)
class Listener:
    name: str
    host: str
    port: int


@dataclass(slots=True)
class BrokerInfo:
    broker_id: int
    broker_epoch: int
    incarnation_id: str
    listeners: tuple[Listener, ...]
    fenced: bool = False
    # The registration's secret (RegisterBrokerResponse.control_token): the controller
    # sends it on every request to this incarnation and takes its requests only with it.
    control_token: bytes = b""
    rack: str = ""  # broker.rack; "" for none

    def listener(self, name: str) -> Listener | None:
        for listener in self.listeners:
            if listener.name == name:
                return listener
        return None

    @property
    def internal(self) -> Listener | None:
        """The endpoint brokers and the controller use; the first listener if none is named INTERNAL."""
        return self.listener("INTERNAL") or (self.listeners[0] if self.listeners else None)


@dataclass(slots=True)
class TopicInfo:
    name: str
    configs: dict[str, str]
    partitions: dict[int, PartitionRecord] = field(default_factory=dict)
    topic_id: bytes = b""  # every PartitionRecord of the topic carries the same


def legacy_topic_id(cluster_id: str, name: str, offset: int) -> bytes:
    """The ID of a topic whose ``topic_created`` record (at ``offset``) predates topic IDs."""
    counter = 0
    while True:
        digest = hashlib.sha256(
            f"tidewater-legacy-topic-id\0{cluster_id}\0{name}\0{offset}\0{counter}".encode()
        ).digest()[:16]
        if is_valid_topic_id(digest):
            return digest
        counter += 1  # a reserved ID: 2**-127, but the rule must hold


# A stub of a deleted topic's partition that a fenced broker still needs a StopReplica for.
PendingStop = tuple[str, int, bytes]  # topic, partition, topic_id (b"": not recorded)


class ImagePoisonedError(RuntimeError):
    """The image was read after it got ahead of the metadata log (see ``poison``)."""


class ClusterMetadata:
    """Brokers, topics and partitions as of the last applied record."""

    def __init__(self) -> None:
        self.cluster_id: str = ""
        self.controller_epoch: int = 0
        self.brokers: dict[int, BrokerInfo] = {}
        self.topics: dict[str, TopicInfo] = {}
        self.topic_names_by_id: dict[bytes, str] = {}  # an index of the topics' IDs
        self.topics_created_total = 0  # spreads replica assignment across topics
        self.unclean_elections_total = 0
        # Partitions of deleted topics whose replica was fenced at the time: it
        # gets a StopReplica when it returns.
        self.pending_stops: dict[int, set[PendingStop]] = {}
        self.security = SecurityImage()  # users' SCRAM credentials and ACLs
        self.quotas = QuotaImage()  # client quotas
        # Dynamic broker configs by resource name: a broker id, or "" for every broker.
        self.broker_configs: dict[str, dict[str, str]] = {}
        # The first producer id no block handed out holds (producer_ids records).
        self.next_producer_id = 0
        self.last_offset = -1

    # ------------------------------------------------------------ queries

    def partition(self, topic: str, partition: int) -> PartitionRecord | None:
        info = self.topics.get(topic)
        return info.partitions.get(partition) if info else None

    def all_partitions(self) -> Iterator[PartitionRecord]:
        for info in self.topics.values():
            yield from info.partitions.values()

    def unfenced_broker_ids(self) -> set[int]:
        return {b.broker_id for b in self.brokers.values() if not b.fenced}

    def partitions_of_broker(self, broker_id: int) -> list[PartitionRecord]:
        return [p for p in self.all_partitions() if broker_id in p.replicas]

    def poison(self, cause: BaseException) -> None:
        """Make every later read of this image raise ``ImagePoisonedError``.

        The image may hold records the log lacks: whoever still holds a
        reference to it (a sender between two awaits, a handler) must not be
        able to send a byte of it. Swapping the class reaches every reference
        at once, with no check to forget in any reader.
        """
        self._poison_cause = cause
        self.__class__ = _PoisonedMetadata

    def topic_ids(self) -> KeysView[bytes]:
        """The current topics' IDs (a live view)."""
        return self.topic_names_by_id.keys()

    # ------------------------------------------------------------ replay

    def apply(self, offset: int, record: MetadataRecord) -> None:
        """Apply one record; raises CorruptFileError when it does not fit the image."""
        kind = record.get("type")
        # Any JSON value can stand here; an unhashable one must not escape as TypeError.
        handler = _HANDLERS.get(kind) if isinstance(kind, str) else None
        if handler is None:
            raise CorruptFileError(f"unknown metadata record type {kind!r} at offset {offset}")
        try:
            handler(self, offset, record)
        except (KeyError, TypeError, ValueError, AssertionError) as e:
            raise CorruptFileError(
                f"metadata record {kind} at offset {offset} does not apply: {e!r}") from e
        self.last_offset = offset

    def _apply_cluster(self, offset: int, r: MetadataRecord) -> None:
        self.cluster_id = r["cluster_id"]

    def _apply_controller_epoch(self, offset: int, r: MetadataRecord) -> None:
        epoch = int(r["epoch"])
        if epoch <= self.controller_epoch:
            raise ValueError(f"controller epoch {epoch} after {self.controller_epoch}")
        self.controller_epoch = epoch

    def _apply_broker_registered(self, offset: int, r: MetadataRecord) -> None:
        listeners = tuple(Listener(str(n), str(h), int(p)) for n, h, p in r["listeners"])
        broker_id = int(r["broker_id"])
        epoch = int(r.get("broker_epoch", offset))
        token = bytes.fromhex(str(r.get("control_token", "")))
        self.brokers[broker_id] = BrokerInfo(broker_id, epoch, str(r["incarnation_id"]), listeners,
                                             control_token=token, rack=str(r.get("rack", "")))

    def _apply_broker_fenced(self, offset: int, r: MetadataRecord) -> None:
        self.brokers[int(r["broker_id"])].fenced = True

    def _apply_broker_unfenced(self, offset: int, r: MetadataRecord) -> None:
        self.brokers[int(r["broker_id"])].fenced = False

    def _apply_partitions_created(self, offset: int, r: MetadataRecord) -> None:
        info = self.topics[r["name"]]
        for p in r["partitions"]:
            number = int(p["partition"])
            if number != len(info.partitions):
                raise ValueError(f"topic {info.name}: partition {number} after "
                                 f"{len(info.partitions)} partitions")
            info.partitions[number] = PartitionRecord(
                info.name, number, tuple(p["replicas"]), tuple(p["isr"]), int(p["leader"]),
                0, 0, info.topic_id)

    def _apply_topic_created(self, offset: int, r: MetadataRecord) -> None:
        name = r["name"]
        if name in self.topics:
            raise ValueError(f"topic {name} exists")
        if "topic_id" in r:
            topic_id = topic_id_from_text(r["topic_id"])
            if not is_valid_topic_id(topic_id):
                raise ValueError(f"topic {name}: reserved topic id {r['topic_id']}")
        else:
            topic_id = legacy_topic_id(self.cluster_id, name, offset)
        if topic_id in self.topic_names_by_id:
            raise ValueError(f"topic {name}: topic id {topic_id_to_text(topic_id)} is taken")
        info = TopicInfo(name, {str(k): str(v) for k, v in r["configs"].items()},
                         topic_id=topic_id)
        for p in r["partitions"]:
            number = int(p["partition"])
            info.partitions[number] = PartitionRecord(
                name, number, tuple(p["replicas"]), tuple(p["isr"]), int(p["leader"]),
                int(p.get("leader_epoch", 0)), int(p.get("partition_epoch", 0)), topic_id,
                adding=tuple(p.get("adding_replicas", ())),
                removing=tuple(p.get("removing_replicas", ())))
        self.topics[name] = info
        self.topic_names_by_id[topic_id] = name
        self.topics_created_total += 1

    def _apply_partition_changed(self, offset: int, r: MetadataRecord) -> None:
        info = self.topics[r["topic"]]
        old = info.partitions[int(r["partition"])]
        new = replace(old, isr=tuple(r["isr"]), leader=int(r["leader"]),
                      leader_epoch=int(r["leader_epoch"]),
                      partition_epoch=int(r["partition_epoch"]))
        if "replicas" in r:
            new = replace(new, replicas=tuple(int(b) for b in r["replicas"]),
                          adding=tuple(int(b) for b in r.get("adding_replicas", ())),
                          removing=tuple(int(b) for b in r.get("removing_replicas", ())))
        if new.leader_epoch < old.leader_epoch or new.partition_epoch <= old.partition_epoch:
            raise ValueError(f"epochs go backwards: {old} -> {new}")
        info.partitions[old.partition] = new
        if r.get("unclean"):
            self.unclean_elections_total += 1

    def _apply_topic_deleted(self, offset: int, r: MetadataRecord) -> None:
        name = r["name"]
        topic_id = self.topics.pop(name).topic_id
        del self.topic_names_by_id[topic_id]
        for broker_id, partitions in r.get("pending_stops", {}).items():
            self.pending_stops.setdefault(int(broker_id), set()).update(
                (name, int(n), topic_id) for n in partitions)

    def _apply_pending_stops_cleared(self, offset: int, r: MetadataRecord) -> None:
        self.pending_stops.pop(int(r["broker_id"]), None)

    def _apply_pending_stops(self, offset: int, r: MetadataRecord) -> None:
        self.pending_stops.setdefault(int(r["broker_id"]), set()).update(
            (str(item[0]), int(item[1]),
             topic_id_from_text(item[2]) if len(item) > 2 and item[2] else b"")
            for item in r["partitions"])

    def _apply_configs_altered(self, offset: int, r: MetadataRecord) -> None:
        configs = {str(k): str(v) for k, v in r["configs"].items()}
        name, resource_type = str(r["name"]), int(r["resource_type"])
        if resource_type == 2:  # TOPIC
            self.topics[name].configs = configs
        elif resource_type == 4:  # BROKER
            if configs:
                self.broker_configs[name] = configs
            else:
                self.broker_configs.pop(name, None)
        else:
            raise ValueError(f"resource type {resource_type} has no configs")

    def _apply_security(self, offset: int, r: MetadataRecord) -> None:
        self.security.apply(r["type"], r)

    def _apply_quota(self, offset: int, r: MetadataRecord) -> None:
        self.quotas.apply(r["type"], r)

    def _apply_producer_ids(self, offset: int, r: MetadataRecord) -> None:
        next_id = int(r["next_producer_id"])
        if next_id <= self.next_producer_id:
            raise ValueError(f"producer ids go backwards: {next_id} after "
                             f"{self.next_producer_id}")
        self.next_producer_id = next_id

    def _apply_counters(self, offset: int, r: MetadataRecord) -> None:
        self.unclean_elections_total = int(r["unclean_elections_total"])
        self.topics_created_total = int(r["topics_created_total"])

    # ------------------------------------------------------------ snapshot

    def snapshot_records(self) -> list[MetadataRecord]:
        """Records that rebuild this image from nothing (for compaction)."""
        records = []
        if self.cluster_id:
            records.append(cluster_record(self.cluster_id))
        if self.controller_epoch:
            records.append(controller_epoch_record(self.controller_epoch))
        for b in sorted(self.brokers.values(), key=lambda b: b.broker_id):
            record = broker_registered_record(b.broker_id, b.incarnation_id, list(b.listeners),
                                              b.control_token, rack=b.rack)
            record["broker_epoch"] = b.broker_epoch
            records.append(record)
            if b.fenced:
                records.append(broker_fenced_record(b.broker_id))
        for info in sorted(self.topics.values(), key=lambda t: t.name):
            partitions = [info.partitions[n] for n in sorted(info.partitions)]
            records.append(topic_created_record(info.name, info.configs, partitions,
                                                topic_id=info.topic_id, with_epochs=True))
        for broker_id in sorted(self.pending_stops):
            records.append({"type": "pending_stops", "broker_id": broker_id,
                            "partitions": sorted(
                                [t, n, topic_id_to_text(i) if i else ""]
                                for t, n, i in self.pending_stops[broker_id])})
        for name in sorted(self.broker_configs):
            records.append({"type": "configs_altered", "resource_type": 4, "name": name,
                            "configs": dict(sorted(self.broker_configs[name].items()))})
        records += self.security.snapshot_records()
        records += self.quotas.snapshot_records()
        if self.next_producer_id:
            records.append(producer_ids_record(-1, -1, self.next_producer_id))
        # after the topics: topic_created counts itself, this sets the true totals
        records.append({"type": "counters",
                        "unclean_elections_total": self.unclean_elections_total,
                        "topics_created_total": self.topics_created_total})
        return records


class _PoisonedMetadata(ClusterMetadata):
    """A ``ClusterMetadata`` whose every attribute read raises (see ``ClusterMetadata.poison``)."""

    def __getattribute__(self, name: str) -> Any:
        if name.startswith("__"):  # type(), repr() and friends keep working
            return object.__getattribute__(self, name)
        cause = object.__getattribute__(self, "_poison_cause")
        raise ImagePoisonedError(
            f"metadata image read ({name}) after it got ahead of the log: {cause}") from cause


_HANDLERS: dict[str, Callable[[ClusterMetadata, int, MetadataRecord], None]] = {
    "cluster": ClusterMetadata._apply_cluster,
    "controller_epoch": ClusterMetadata._apply_controller_epoch,
    "broker_registered": ClusterMetadata._apply_broker_registered,
    "broker_fenced": ClusterMetadata._apply_broker_fenced,
    "broker_unfenced": ClusterMetadata._apply_broker_unfenced,
    "topic_created": ClusterMetadata._apply_topic_created,
    "partition_changed": ClusterMetadata._apply_partition_changed,
    "partitions_created": ClusterMetadata._apply_partitions_created,
    "topic_deleted": ClusterMetadata._apply_topic_deleted,
    "counters": ClusterMetadata._apply_counters,
    "pending_stops_cleared": ClusterMetadata._apply_pending_stops_cleared,
    "pending_stops": ClusterMetadata._apply_pending_stops,
    **{kind: ClusterMetadata._apply_security for kind in SECURITY_RECORD_TYPES},
    **{kind: ClusterMetadata._apply_quota for kind in QUOTA_RECORD_TYPES},
    "producer_ids": ClusterMetadata._apply_producer_ids,
    "configs_altered": ClusterMetadata._apply_configs_altered,
}


# ---------------------------------------------------------------- record constructors

def cluster_record(cluster_id: str) -> MetadataRecord:
    return {"type": "cluster", "cluster_id": cluster_id}


def controller_epoch_record(epoch: int) -> MetadataRecord:
    return {"type": "controller_epoch", "epoch": epoch}


def broker_registered_record(broker_id: int, incarnation_id: str, listeners: list[Listener],
                             control_token: bytes = b"", *, rack: str = "") -> MetadataRecord:
    record: MetadataRecord = {
        "type": "broker_registered", "broker_id": broker_id, "incarnation_id": incarnation_id,
        "listeners": [[x.name, x.host, x.port] for x in listeners],
        "control_token": control_token.hex()}
    if rack:  # records of rackless brokers stay as they were
        record["rack"] = rack
    return record


def broker_fenced_record(broker_id: int) -> MetadataRecord:
    return {"type": "broker_fenced", "broker_id": broker_id}


def broker_unfenced_record(broker_id: int) -> MetadataRecord:
    return {"type": "broker_unfenced", "broker_id": broker_id}


def partitions_created_record(name: str, partitions: list[PartitionRecord]) -> MetadataRecord:
    return {"type": "partitions_created", "name": name, "partitions": [
        {"partition": p.partition, "replicas": list(p.replicas), "isr": list(p.isr),
         "leader": p.leader} for p in partitions]}


def topic_created_record(name: str, configs: dict[str, str], partitions: list[PartitionRecord],
                         *, topic_id: bytes, with_epochs: bool = False) -> MetadataRecord:
    items = []
    for p in partitions:
        item: dict[str, Any] = {"partition": p.partition, "replicas": list(p.replicas),
                                "isr": list(p.isr), "leader": p.leader}
        if with_epochs:
            item["leader_epoch"] = p.leader_epoch
            item["partition_epoch"] = p.partition_epoch
        if p.reassigning:  # a snapshot of a partition mid-reassignment
            item["adding_replicas"] = list(p.adding)
            item["removing_replicas"] = list(p.removing)
        items.append(item)
    return {"type": "topic_created", "name": name, "topic_id": topic_id_to_text(topic_id),
            "configs": dict(configs), "partitions": items}


def partition_changed_record(p: PartitionRecord, *, unclean: bool = False) -> MetadataRecord:
    return {"type": "partition_changed", "topic": p.topic, "partition": p.partition,
            "leader": p.leader, "isr": list(p.isr), "leader_epoch": p.leader_epoch,
            "partition_epoch": p.partition_epoch, "unclean": unclean,
            "replicas": list(p.replicas), "adding_replicas": list(p.adding),
            "removing_replicas": list(p.removing)}


def topic_deleted_record(name: str,
                         pending_stops: dict[int, list[int]] | None = None) -> MetadataRecord:
    record: MetadataRecord = {"type": "topic_deleted", "name": name}
    if pending_stops:
        record["pending_stops"] = {str(b): sorted(ns) for b, ns in pending_stops.items()}
    return record


def pending_stops_cleared_record(broker_id: int) -> MetadataRecord:
    return {"type": "pending_stops_cleared", "broker_id": broker_id}


def producer_ids_record(broker_id: int, broker_epoch: int, next_producer_id: int) -> MetadataRecord:
    """A block of producer ids given to ``broker_id`` (Kafka's ProducerIdsRecord): every id
    below ``next_producer_id`` is handed out (-1 broker: a snapshot's)."""
    return {"type": "producer_ids", "broker_id": broker_id, "broker_epoch": broker_epoch,
            "next_producer_id": next_producer_id}
