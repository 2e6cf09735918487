"""Protobuf messages built from the metadata image (pure: image in, message out)."""

from __future__ import annotations

from collections.abc import Iterable

from tidewater.controller.election import PartitionRecord
from tidewater.controller.metadata import BrokerInfo, ClusterMetadata
from tidewater.controller.sessions import BrokerSessions
from tidewater.proto import tidewater_pb2 as pb


def partition_state(p: PartitionRecord) -> pb.PartitionState:
    return pb.PartitionState(topic=p.topic, partition=p.partition, leader=p.leader,
                             leader_epoch=p.leader_epoch, partition_epoch=p.partition_epoch,
                             replicas=p.replicas, isr=p.isr, offline=p.offline,
                             topic_id=p.topic_id)


def broker_registration(b: BrokerInfo, sessions: BrokerSessions | None) -> pb.BrokerRegistration:
    return pb.BrokerRegistration(
        broker_id=b.broker_id, broker_epoch=b.broker_epoch,
        listeners=[pb.Listener(name=x.name, host=x.host, port=x.port) for x in b.listeners],
        fenced=b.fenced, rack=b.rack,
        in_controlled_shutdown=bool(sessions and sessions.in_controlled_shutdown(b.broker_id)))


def leader_and_isr(metadata: ClusterMetadata, controller_id: int, broker_id: int,
                   partitions: Iterable[tuple[PartitionRecord, bool]]) -> pb.LeaderAndIsrRequest:
    """LeaderAndIsr for ``broker_id`` with (partition, is_new) pairs and their leaders' endpoints."""
    broker = metadata.brokers[broker_id]
    request = pb.LeaderAndIsrRequest(controller_id=controller_id,
                                     controller_epoch=metadata.controller_epoch,
                                     broker_epoch=broker.broker_epoch,
                                     cluster_id=metadata.cluster_id,
                                     metadata_offset=metadata.last_offset,
                                     control_token=broker.control_token)
    leaders: set[int] = set()
    for p, is_new in partitions:
        configs = metadata.topics[p.topic].configs
        request.partitions.add(state=partition_state(p), topic_configs=configs, is_new=is_new)
        if p.leader >= 0:
            leaders.add(p.leader)
    for leader in sorted(leaders):
        info = metadata.brokers.get(leader)
        endpoint = info.internal if info else None
        if endpoint is not None:
            request.leaders.add(broker_id=leader, host=endpoint.host, port=endpoint.port)
    return request


def update_metadata(metadata: ClusterMetadata, controller_id: int, broker_id: int,
                    sessions: BrokerSessions | None = None) -> pb.UpdateMetadataRequest:
    """The full snapshot every live broker gets (live brokers, all partitions and topic
    configs), for ``broker_id``: with its control token."""
    request = pb.UpdateMetadataRequest(controller_id=controller_id,
                                       controller_epoch=metadata.controller_epoch,
                                       cluster_id=metadata.cluster_id,
                                       metadata_offset=metadata.last_offset,
                                       control_token=metadata.brokers[broker_id].control_token)
    for b in sorted(metadata.brokers.values(), key=lambda b: b.broker_id):
        if not b.fenced:
            request.brokers.append(broker_registration(b, sessions))
    for info in sorted(metadata.topics.values(), key=lambda t: t.name):
        request.topics.add(name=info.name, configs=info.configs)
        for number in sorted(info.partitions):
            request.partitions.append(partition_state(info.partitions[number]))
    request.scram_credentials.extend(metadata.security.credentials_pb())
    request.acls.extend(metadata.security.acls_pb())
    request.client_quotas.extend(metadata.quotas.quotas_pb())
    for name in sorted(metadata.broker_configs):
        request.broker_configs.add(resource_name=name, configs=metadata.broker_configs[name])
    return request


def stop_replica(metadata: ClusterMetadata, controller_id: int, broker_id: int,
                 partitions: Iterable[PartitionRecord], *, delete: bool) -> pb.StopReplicaRequest:
    broker = metadata.brokers[broker_id]
    return pb.StopReplicaRequest(
        controller_id=controller_id, controller_epoch=metadata.controller_epoch,
        broker_epoch=broker.broker_epoch, delete_partitions=delete,
        partitions=[partition_state(p) for p in partitions], cluster_id=metadata.cluster_id,
        control_token=broker.control_token)


def describe_cluster(metadata: ClusterMetadata, sessions: BrokerSessions,
                     controller_id: int) -> pb.DescribeClusterResponse:
    response = pb.DescribeClusterResponse(
        error_code=pb.NONE, cluster_id=metadata.cluster_id, controller_id=controller_id,
        controller_epoch=metadata.controller_epoch,
        unclean_elections_total=metadata.unclean_elections_total)
    for b in sorted(metadata.brokers.values(), key=lambda b: b.broker_id):
        response.brokers.append(broker_registration(b, sessions))
    for info in sorted(metadata.topics.values(), key=lambda t: t.name):
        response.topics.add(name=info.name, configs=info.configs, topic_id=info.topic_id,
                            partitions=[partition_state(info.partitions[n])
                                        for n in sorted(info.partitions)])
    for name in sorted(metadata.broker_configs):
        response.broker_configs.add(resource_name=name, configs=metadata.broker_configs[name])
    return response
