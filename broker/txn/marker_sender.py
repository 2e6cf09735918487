"""The broker's ``TxnMarkerSender`` (``markers.py``'s port): markers go to the partition
leader's ``TxnMarkerWriter`` (``broker/serving/txn_markers.py``), in process when this
broker is the leader, else over the leader's INTERNAL gRPC (``BrokerControl.
WriteTxnMarkers`` through ``RemoteMarkerWriter``), as Kafka's
TransactionMarkerChannelManager sends WriteTxnMarkers to each leader.

``send_until_written`` groups a job's partitions per leader and calls
``write_markers`` once per leader; a leader that moved answers NOT_LEADER_OR_FOLLOWER
for its partitions, and the next round looks the leaders up again in the metadata
cache (which UpdateMetadata keeps current). This module only carries the calls.

Channels: one per leader broker, opened on first use to the leader's INTERNAL endpoint
as the metadata cache knows it, and reopened when that endpoint changes (a restarted
broker on another port). They present what the follower fetchers present: the
broker's certificate with TLS (the receiving side takes WriteTxnMarkers only from a
``broker-<id>`` certificate, ``control_rules``) and, with SASL, the inter-broker
credentials (``inter.broker.credentials.file``) as call metadata (the receiving side
requires CLUSTER_ACTION on the cluster).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from typing import cast

import grpc

from tidewater.broker.channels import channel_options
from tidewater.broker.security.inter_broker import ChannelOpener, plain_channel
from tidewater.broker.serving.txn_markers import (
    RemoteMarkerWriter,
    TxnMarkerEntry,
    TxnMarkerResult,
    TxnMarkerWriter,
)
from tidewater.broker.txn.markers import TxnMarker
from tidewater.broker.txn.state import TopicPartition
from tidewater.proto import tidewater_pb2 as pb
from tidewater.proto import tidewater_pb2_grpc as pb_grpc
from tidewater.proto.errors import InvariantViolation, TidewaterError

log = logging.getLogger("tidewater.broker.txn")

# A leader's answer comes once the markers are committed (acks=all); the coordinator
# retries after this long (Kafka's request.timeout.ms for the markers channel is 30 s;
# shorter here so a marker to a leader that died mid-wait is re-sent to its successor
# without a long stall).
MARKER_REQUEST_TIMEOUT_MS = 10_000


class LeaderUnknownError(TidewaterError):
    """The metadata has no INTERNAL endpoint for the leader: retried after a refresh."""

    error_code = pb.LEADER_NOT_AVAILABLE
    retriable = True


class LeaderMarkerSender:
    """``TxnMarkerSender`` over the log side: local ``MarkerWriter`` or remote leader."""

    def __init__(self, *, broker_id: int, local_writer: TxnMarkerWriter,
                 endpoint: Callable[[int], tuple[str, int] | None],
                 max_message_bytes: int,
                 channel_credentials: grpc.ChannelCredentials | None = None,
                 call_metadata: tuple[tuple[str, str], ...] = (),
                 open_channel: ChannelOpener = plain_channel,
                 request_timeout_ms: int = MARKER_REQUEST_TIMEOUT_MS):
        """``endpoint``: a broker's INTERNAL (host, port) from the metadata cache.
        ``channel_credentials``/``call_metadata``: as the follower fetchers'."""
        self._broker_id = broker_id
        self._local = local_writer
        self._endpoint = endpoint
        self._max_message_bytes = max_message_bytes
        self._credentials = channel_credentials
        self._call_metadata = call_metadata
        self._open_channel = open_channel
        self._request_timeout_ms = request_timeout_ms
        # leader broker id -> (endpoint, channel, writer)
        self._remotes: dict[int, tuple[tuple[str, int], grpc.aio.Channel,
                                       RemoteMarkerWriter]] = {}
        self._closed = False

    async def _writer_for(self, leader_broker_id: int) -> TxnMarkerWriter:
        if leader_broker_id == self._broker_id:
            return self._local
        endpoint = self._endpoint(leader_broker_id)
        if endpoint is None:
            raise LeaderUnknownError(f"no INTERNAL endpoint known for broker "
                                     f"{leader_broker_id}")
        known = self._remotes.get(leader_broker_id)
        if known is not None and known[0] == endpoint:
            return known[2]
        if known is not None:  # the broker moved (restarted elsewhere): a new channel
            del self._remotes[leader_broker_id]
            await known[1].close()
        if self._closed:
            raise LeaderUnknownError("the marker sender is closed")
        channel = self._open_channel(f"{endpoint[0]}:{endpoint[1]}",
                                     channel_options(self._max_message_bytes), self._credentials)
        writer = RemoteMarkerWriter(channel, call_metadata=self._call_metadata)
        self._remotes[leader_broker_id] = (endpoint, channel, writer)
        return writer

    async def remote_stub(self, broker_id: int) -> pb_grpc.BrokerControlStub:
        """Another broker's BrokerControl on this sender's channel to it (the KIP-890
        verifier asks a remote transaction coordinator there); raises as
        ``write_markers`` does when the broker's endpoint is unknown."""
        if broker_id == self._broker_id:
            raise InvariantViolation("a remote stub asked for this broker itself")
        writer = await self._writer_for(broker_id)
        if not isinstance(writer, RemoteMarkerWriter):
            raise InvariantViolation(f"broker {broker_id}'s writer is not remote")
        return writer.stub

    async def write_markers(self, leader_broker_id: int, markers: Sequence[TxnMarker]
                            ) -> list[dict[TopicPartition, pb.ErrorCode]]:
        """Raises (a transport failure, an unknown endpoint) when nothing is known
        written: ``send_until_written`` retries the whole call."""
        entries = [TxnMarkerEntry(m.producer_id, m.producer_epoch, m.coordinator_epoch,
                                  m.committed, tuple(m.partitions)) for m in markers]
        writer = await self._writer_for(leader_broker_id)
        results = await writer.write_txn_markers(entries, timeout_ms=self._request_timeout_ms)
        return codes_by_marker(entries, results)

    async def close(self) -> None:
        self._closed = True
        remotes, self._remotes = self._remotes, {}
        await asyncio.gather(*(channel.close() for _, channel, _ in remotes.values()),
                             return_exceptions=True)


def codes_by_marker(entries: Sequence[TxnMarkerEntry], results: Sequence[TxnMarkerResult]
                    ) -> list[dict[TopicPartition, pb.ErrorCode]]:
    """The writer's flat results (one per (entry, partition), in order) per entry. A
    short answer leaves the missing partitions out (the caller retries them)."""
    answers = iter(results)
    by_marker: list[dict[TopicPartition, pb.ErrorCode]] = []
    for entry in entries:
        codes: dict[TopicPartition, pb.ErrorCode] = {}
        for topic, partition in entry.partitions:
            result = next(answers, None)
            if result is None:
                break
            if (result.topic, result.partition) != (topic, partition):
                log.warning("WriteTxnMarkers answered %s-%d for %s-%d; retrying",
                            result.topic, result.partition, topic, partition)
                break
            codes[(topic, partition)] = cast(pb.ErrorCode, result.error_code)
        by_marker.append(codes)
    return by_marker
