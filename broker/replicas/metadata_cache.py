"""The broker's view of the cluster, replaced wholesale by each UpdateMetadata.

The controller sends a full snapshot (live brokers with all their listeners,
every partition's state, topic configs) with its controller epoch; a snapshot
from an older controller epoch is refused. Metadata answers come from here,
with broker addresses on the listener the request came in on.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from tidewater.broker.kafka.client_quotas import ClientQuotas, entity_from_pb
from tidewater.proto import tidewater_pb2 as pb
from tidewater.proto.acls import Acl
from tidewater.proto.errors import StaleControllerEpochError
from tidewater.proto.scram import ScramCredential, credential_from_pb


@dataclass
class ClusterSnapshot:
    controller_id: int = -1
    controller_epoch: int = -1
    cluster_id: str = ""
    # broker id -> listener name -> (host, port)
    brokers: dict[int, dict[str, tuple[str, int]]] = field(default_factory=dict)
    racks: dict[int, str] = field(default_factory=dict)  # broker id -> broker.rack, if set
    # topic -> partition -> state
    partitions: dict[str, dict[int, pb.PartitionState]] = field(default_factory=dict)
    topic_configs: dict[str, dict[str, str]] = field(default_factory=dict)
    topic_ids: dict[str, bytes] = field(default_factory=dict)
    topic_names_by_id: dict[bytes, str] = field(default_factory=dict)
    # Users and ACLs (broker/security/settings.py authenticates and authorizes with them).
    scram_credentials: dict[tuple[str, str], ScramCredential] = field(default_factory=dict)
    acls: tuple[Acl, ...] = ()
    # Dynamic broker configs: resource name ("" every broker, else a broker id) -> configs.
    broker_configs: dict[str, dict[str, str]] = field(default_factory=dict)


class MetadataCache:
    def __init__(self) -> None:
        self._snapshot = ClusterSnapshot()
        # The client quotas every snapshot brings, and the rates they are enforced on
        # (the Kafka listener charges them); rates outlive snapshots.
        self.client_quotas = ClientQuotas()

    @property
    def controller_epoch(self) -> int:
        return self._snapshot.controller_epoch

    @property
    def cluster_id(self) -> str:
        return self._snapshot.cluster_id

    def update(self, request: pb.UpdateMetadataRequest) -> None:
        """Replace the snapshot; StaleControllerEpochError for an older controller."""
        if request.controller_epoch < self._snapshot.controller_epoch:
            raise StaleControllerEpochError(
                f"controller epoch {request.controller_epoch} is older than "
                f"{self._snapshot.controller_epoch}"
            )
        snap = ClusterSnapshot(
            controller_id=request.controller_id,
            controller_epoch=request.controller_epoch,
            cluster_id=request.cluster_id,
        )
        for b in request.brokers:
            if b.fenced:
                continue
            snap.brokers[b.broker_id] = {lst.name: (lst.host, lst.port) for lst in b.listeners}
            if b.rack:
                snap.racks[b.broker_id] = b.rack
        for p in request.partitions:
            state = pb.PartitionState()
            state.CopyFrom(p)
            snap.partitions.setdefault(p.topic, {})[p.partition] = state
            if p.topic_id:
                snap.topic_ids[p.topic] = p.topic_id
                snap.topic_names_by_id[p.topic_id] = p.topic
        for t in request.topics:
            snap.topic_configs[t.name] = dict(t.configs)
        snap.scram_credentials = {(c.user, c.mechanism): credential_from_pb(c)
                                  for c in request.scram_credentials}
        snap.acls = tuple(Acl.from_pb(b) for b in request.acls)
        snap.broker_configs = {o.resource_name: dict(o.configs) for o in request.broker_configs}
        self._snapshot = snap
        self.client_quotas.replace_all({entity_from_pb(q.entity): dict(q.values)
                                        for q in request.client_quotas})

    def scram_credential(self, user: str, mechanism: str) -> ScramCredential | None:
        return self._snapshot.scram_credentials.get((user, mechanism))

    def scram_iterations(self, mechanism: str) -> list[int]:
        return [c.iterations for (_, m), c in self._snapshot.scram_credentials.items()
                if m == mechanism]

    def user_credentials(self, user: str) -> list[ScramCredential]:
        return [c for (u, _), c in sorted(self._snapshot.scram_credentials.items()) if u == user]

    def acls(self) -> tuple[Acl, ...]:
        """The cluster's ACLs as of the last snapshot (the same tuple until the next)."""
        return self._snapshot.acls

    def endpoint(self, broker_id: int, listener: str = "INTERNAL") -> tuple[str, int] | None:
        return self._snapshot.brokers.get(broker_id, {}).get(listener)

    def partition_state(self, topic: str, partition: int) -> pb.PartitionState | None:
        return self._snapshot.partitions.get(topic, {}).get(partition)

    def topic_configs(self, topic: str) -> dict[str, str]:
        return dict(self._snapshot.topic_configs.get(topic, {}))

    def broker_configs(self) -> dict[str, dict[str, str]]:
        """The dynamic broker configs by resource name ("": the cluster-wide defaults)."""
        return {name: dict(configs) for name, configs in self._snapshot.broker_configs.items()}

    def topics(self) -> list[str]:
        return sorted(self._snapshot.partitions)

    def topic_id(self, topic: str) -> bytes:
        """The topic's ID in the last snapshot (b"" when unknown)."""
        return self._snapshot.topic_ids.get(topic, b"")

    def topic_names_by_id(self) -> dict[bytes, str]:
        return self._snapshot.topic_names_by_id

    def metadata_response(self, topics: list[str], listener: str) -> pb.MetadataResponse:
        snap = self._snapshot
        resp = pb.MetadataResponse(controller_id=snap.controller_id, cluster_id=snap.cluster_id)
        for broker_id in sorted(snap.brokers):
            address = snap.brokers[broker_id].get(listener)
            if address is None:
                # The broker has no listener of that name: clients on it cannot reach it.
                continue
            resp.brokers.add(broker_id=broker_id, host=address[0], port=address[1],
                             rack=snap.racks.get(broker_id, ""))
        live = set(snap.brokers)
        for name in (topics or sorted(snap.partitions)):
            parts = snap.partitions.get(name)
            if parts is None:
                resp.topics.add(name=name, error_code=pb.UNKNOWN_TOPIC_OR_PARTITION)
                continue
            t = resp.topics.add(name=name, error_code=pb.NONE,
                                topic_id=snap.topic_ids.get(name, b""))
            for index in sorted(parts):
                s = parts[index]
                offline = s.leader < 0 or s.offline or s.leader not in live
                t.partitions.add(
                    partition=index,
                    error_code=pb.LEADER_NOT_AVAILABLE if offline else pb.NONE,
                    leader=s.leader if not offline else -1,
                    leader_epoch=s.leader_epoch,
                    replicas=list(s.replicas),
                    isr=list(s.isr),
                    offline_replicas=[r for r in s.replicas if r not in live],
                )
        return resp
