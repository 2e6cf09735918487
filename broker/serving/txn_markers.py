"""Transaction markers: the partition leader's side of WriteTxnMarkers (KIP-98).

The transaction coordinator ends a transaction by asking the leader of every
partition the transaction touched to append a marker: a control batch COMMIT
or ABORT (``proto/control_records.py``) carrying the producer's id and epoch and
the coordinator's epoch. This module is the one place markers are written; the
Kafka API (``broker/kafka/txn_apis.py``, key 27) and the broker's internal gRPC
``WriteTxnMarkers`` both call it, and so may the coordinator in-process.

The coordinator's port (call this; do not reach into the log)::

    class TxnMarkerWriter(Protocol):
        async def write_txn_markers(self, markers: Sequence[TxnMarkerEntry], *,
                                    timeout_ms: int = MARKER_TIMEOUT_MS_DEFAULT
                                    ) -> list[TxnMarkerResult]: ...

``ReplicaManager.txn_markers`` is the broker's implementation (``MarkerWriter``),
for partitions this broker leads; ``RemoteMarkerWriter(channel)`` is the same
port over another broker's internal gRPC (``BrokerControl.WriteTxnMarkers``,
mapped to its ``MarkerWriter``), for partitions led elsewhere.
Each ``TxnMarkerEntry`` names one producer's transaction and the partitions to
mark; the answer has one ``TxnMarkerResult`` per (entry, partition), in order,
with Kafka's error code (``pb.ErrorCode`` numbers):

- NONE: the marker is committed (acks=all: the ISR has it, below the HW). The
  producer's transaction is over on this partition; an ABORT is in the
  partition's ``.txnindex``.
- NOT_LEADER_OR_FOLLOWER / UNKNOWN_TOPIC_OR_PARTITION: not led here (refresh
  metadata, send to the leader). NOT_ENOUGH_REPLICAS(_AFTER_APPEND),
  REQUEST_TIMED_OUT, KAFKA_STORAGE_ERROR: retriable, send again (a marker for a
  transaction already ended is written again harmlessly).
- TRANSACTION_COORDINATOR_FENCED: a coordinator with a newer epoch already wrote
  for this producer (this coordinator is stale: stop). INVALID_PRODUCER_EPOCH:
  the producer's epoch here is newer than the marker's.

Markers of one request are appended in order (each partition's append and its
decision run without an ``await`` between them, as for Produce); the waits for
the HW run together.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

import grpc

from tidewater.broker.clock import mono_ms, wall_ms
from tidewater.broker.error_mapping import error_code_for, wire_code
from tidewater.broker.replicas.partition import Partition
from tidewater.broker.replicas.ready_carrier import ReadyCarrier
from tidewater.broker.replication.replica import acks_all_wait_ms
from tidewater.broker.serving.produce import append_as_leader
from tidewater.broker.serving.purgatory import AcksWait, AcksWaits
from tidewater.broker.txn.verification import VerificationCache
from tidewater.proto import tidewater_pb2 as pb
from tidewater.proto import tidewater_pb2_grpc as pb_grpc
from tidewater.proto.control_records import encode_marker_batch

MARKER_TIMEOUT_MS_DEFAULT = 30_000  # Kafka's request.timeout.ms for the markers channel


@dataclass(frozen=True, slots=True)
class TxnMarkerEntry:
    """One producer's transaction to end on ``partitions`` ((topic, partition) pairs)."""

    producer_id: int
    producer_epoch: int
    coordinator_epoch: int
    committed: bool  # True: COMMIT, False: ABORT
    partitions: tuple[tuple[str, int], ...]


@dataclass(frozen=True, slots=True)
class TxnMarkerResult:
    producer_id: int
    topic: str
    partition: int
    error_code: int  # Kafka's number (pb.ErrorCode)
    error_message: str = ""


class TxnMarkerWriter(Protocol):
    """What the transaction coordinator calls to end a transaction on its partitions."""

    async def write_txn_markers(self, markers: Sequence[TxnMarkerEntry], *,
                                timeout_ms: int = MARKER_TIMEOUT_MS_DEFAULT
                                ) -> list[TxnMarkerResult]: ...


class MarkerWriter:
    """The broker's ``TxnMarkerWriter``: appends as the partition's leader, acks=all."""

    def __init__(self, *, lookup: Callable[[str, int], Partition], carrier: ReadyCarrier,
                 acks_waits: AcksWaits, verification: VerificationCache | None = None):
        """``verification``: the produce path's KIP-890 entries; a marker drops its
        producer's entry for the partition (its next transaction there is verified
        again)."""
        self._verification = verification
        self._lookup = lookup
        self._carrier = carrier
        self._waits = acks_waits
        # Told of each marker once committed here (NONE), as Kafka's WriteTxnMarkers
        # handler tells the group coordinator (``GroupCoordinator.complete_transaction``
        # for ``__consumer_offsets`` partitions): set by the broker process.
        self.on_committed: Callable[[TxnMarkerEntry, str, int], None] | None = None

    async def write_txn_markers(self, markers: Sequence[TxnMarkerEntry], *,
                                timeout_ms: int = MARKER_TIMEOUT_MS_DEFAULT
                                ) -> list[TxnMarkerResult]:
        results: list[TxnMarkerResult] = []
        waits: list[tuple[int, AcksWait]] = []  # (index in results, its acks=all wait)
        entry_of: dict[int, TxnMarkerEntry] = {}  # index in results -> its marker
        timeout_ms = acks_all_wait_ms(timeout_ms if timeout_ms > 0
                                      else MARKER_TIMEOUT_MS_DEFAULT)
        for marker in markers:
            for topic, partition_index in marker.partitions:
                if self._verification is not None:
                    # Before the append: a verification answered after this marker
                    # must not let a late batch open a transaction the marker ended.
                    self._verification.on_marker((topic, partition_index),
                                                 marker.producer_id)
                try:
                    wait = self._append(marker, topic, partition_index, timeout_ms)
                except Exception as e:  # the one boundary: a typed error per partition
                    error_code, message = error_code_for(e, context="WriteTxnMarkers")
                    results.append(TxnMarkerResult(marker.producer_id, topic, partition_index,
                                                   int(error_code), message))
                    continue
                entry_of[len(results)] = marker
                waits.append((len(results), wait))
                results.append(TxnMarkerResult(marker.producer_id, topic, partition_index,
                                               pb.NONE))
        if waits:
            codes = await asyncio.gather(*(self._waits.wait_for(w) for _, w in waits))
            for (i, _), code in zip(waits, codes, strict=True):
                r = results[i]
                if code != pb.NONE:
                    results[i] = TxnMarkerResult(r.producer_id, r.topic, r.partition,
                                                 wire_code(code), pb.ErrorCode.Name(code))
                elif self.on_committed is not None:
                    self.on_committed(entry_of[i], r.topic, r.partition)
        return results

    def _append(self, marker: TxnMarkerEntry, topic: str, partition_index: int,
                timeout_ms: int) -> AcksWait:
        partition = self._lookup(topic, partition_index)
        now_wall_ms = wall_ms()
        records = encode_marker_batch(marker.producer_id, marker.producer_epoch,
                                      committed=marker.committed,
                                      coordinator_epoch=marker.coordinator_epoch,
                                      timestamp_ms=now_wall_ms)
        _info, wait = append_as_leader(partition, records, -1, timeout_ms,
                                       open_wait=self._waits.open, carrier=self._carrier,
                                       now_ms=mono_ms(), wall_now_ms=now_wall_ms,
                                       markers_allowed=True)
        assert wait is not None  # acks=all always opens one
        return wait


class RemoteMarkerWriter:
    """``TxnMarkerWriter`` over a broker's internal gRPC (a ``grpc.aio`` channel to its
    INTERNAL listener). A transport failure raises ``grpc.RpcError`` (retry, after a
    metadata refresh); answers carry the per-partition codes as in process.
    ``call_metadata``: what each call carries (the broker's SASL credentials, as the
    follower fetchers' calls: the receiver requires CLUSTER_ACTION in SASL mode)."""

    def __init__(self, channel: grpc.aio.Channel, *,
                 call_metadata: tuple[tuple[str, str], ...] = ()):
        self._stub = pb_grpc.BrokerControlStub(channel)
        self._call_metadata = call_metadata

    @property
    def stub(self) -> pb_grpc.BrokerControlStub:
        """The broker's BrokerControl on this channel (the KIP-890 verifier's calls)."""
        return self._stub

    async def write_txn_markers(self, markers: Sequence[TxnMarkerEntry], *,
                                timeout_ms: int = MARKER_TIMEOUT_MS_DEFAULT
                                ) -> list[TxnMarkerResult]:
        response = await self._stub.WriteTxnMarkers(
            markers_to_proto(markers, timeout_ms), timeout=timeout_ms / 1000 + 5,
            metadata=self._call_metadata or None)
        return [TxnMarkerResult(r.producer_id, r.topic, r.partition, int(r.error_code),
                                r.error_message) for r in response.results]


def markers_to_proto(markers: Sequence[TxnMarkerEntry],
                     timeout_ms: int = MARKER_TIMEOUT_MS_DEFAULT) -> pb.WriteTxnMarkersRequest:
    return pb.WriteTxnMarkersRequest(timeout_ms=timeout_ms, markers=[
        pb.TxnMarker(producer_id=m.producer_id, producer_epoch=m.producer_epoch,
                     coordinator_epoch=m.coordinator_epoch, committed=m.committed,
                     partitions=[pb.TxnMarkerPartition(topic=t, partition=p)
                                 for t, p in m.partitions])
        for m in markers])


def markers_from_proto(request: pb.WriteTxnMarkersRequest) -> list[TxnMarkerEntry]:
    return [TxnMarkerEntry(m.producer_id, m.producer_epoch, m.coordinator_epoch,
                           m.committed, tuple((p.topic, p.partition) for p in m.partitions))
            for m in request.markers]


def results_to_proto(results: Sequence[TxnMarkerResult]) -> pb.WriteTxnMarkersResponse:
    return pb.WriteTxnMarkersResponse(results=[
        pb.TxnMarkerPartitionResult(producer_id=r.producer_id, topic=r.topic,
                                    partition=r.partition,
                                    error_code=wire_code(r.error_code),
                                    error_message=r.error_message)
        for r in results])
