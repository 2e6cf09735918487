"""The cluster this broker's data dir belongs to, and whether a controller request is from it.

The shell around ``topic_identity.cluster_id_decision``: ``meta.properties``
(``storage/meta_properties.py``) is read once at start-up and written the first
time a controller request carries a cluster ID. ``trusts(cluster_id)`` is
asked by every LeaderAndIsr, UpdateMetadata and StopReplica: only a trusted
request may make this broker delete, replace or adopt a log (see
``topic_identity``). A mismatch is logged at ERROR once per foreign cluster ID:
the operator must decide (restore the controller's metadata, or empty this
data dir); the broker keeps serving what it has and deletes nothing meanwhile.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Protocol

from tidewater.broker.replication.topic_identity import ClusterCheck, cluster_id_decision
from tidewater.broker.storage.meta_properties import (
    MetaProperties,
    read_meta_properties,
    write_meta_properties,
)
from tidewater.proto.errors import KafkaStorageError

log = logging.getLogger("tidewater.broker.replicas.cluster_identity")


class MetaPropertiesStore(Protocol):
    """Where ``meta.properties`` lives: the data dir's file, or the simulation's disk."""

    def read(self) -> MetaProperties | None: ...

    def write(self, meta: MetaProperties) -> None: ...


class MetaPropertiesFile:
    def __init__(self, data_dir: Path):
        self.data_dir = Path(data_dir)

    def read(self) -> MetaProperties | None:
        return read_meta_properties(self.data_dir)  # CorruptFileError: fail the start-up

    def write(self, meta: MetaProperties) -> None:
        write_meta_properties(self.data_dir, meta)

    def __str__(self) -> str:
        return f"{self.data_dir}/meta.properties"


class ClusterIdentity:
    def __init__(self, store: MetaPropertiesStore, broker_id: int):
        self.store = store
        self.broker_id = broker_id
        meta = store.read()
        self.cluster_id: str | None = meta.cluster_id if meta is not None else None
        self._refused: set[str] = set()

    @classmethod
    def of_data_dir(cls, data_dir: Path, broker_id: int) -> ClusterIdentity:
        return cls(MetaPropertiesFile(data_dir), broker_id)

    def trusts(self, cluster_id: str) -> bool:
        decision = cluster_id_decision(self.cluster_id, cluster_id)
        if decision is ClusterCheck.MATCH:
            return True
        if decision is ClusterCheck.ADOPT:
            try:
                self.store.write(MetaProperties(self.broker_id, cluster_id))
            except KafkaStorageError as e:
                log.error("cannot record cluster id %s: %s", cluster_id, e)
                return False
            self.cluster_id = cluster_id
            log.info("%s now belongs to cluster %s", self.store, cluster_id)
            return True
        if decision is ClusterCheck.MISMATCH and cluster_id not in self._refused:
            self._refused.add(cluster_id)
            log.error("the controller's cluster id %s is not %s, the one in %s: "
                      "this broker will delete, replace or adopt no log on its word (restore the "
                      "controller's metadata, or empty this data dir)", cluster_id,
                      self.cluster_id, self.store)
        return False
