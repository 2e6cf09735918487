"""Kafka's transaction APIs on the broker's transaction coordinator (``broker/txn``).

Each API's rules (authorization, checks, the coordinator's call) are one function taking
plain values (``init_transactional_producer``, ``add_partitions_to_txn``,
``add_offsets_to_txn``, ``end_txn``, ``txn_offset_commit``): the Kafka handlers below and
gRPC's (``broker/txn/grpc_service.py``) both call them, so both listeners answer alike.

===================== ===== ======================================================
API (key)             vers  notes
===================== ===== ======================================================
FindCoordinator (10)  0-4   key type 1 (TRANSACTION): ``find_txn_coordinator``,
                            called from ``group_apis``; creates __transaction_state
InitProducerId (22)   0-5   with a transactional id: ``on_init_transactional_producer``,
                            called from ``producer_apis``
AddPartitionsToTxn    0-5   v4-5: the brokers' batched form (KIP-890), CLUSTER_ACTION
(24)                        on the cluster; ``verify_only`` answers whether each
                            partition is in the ongoing transaction, writing nothing
AddOffsetsToTxn (25)  0-3   adds the group's ``__consumer_offsets`` partition
EndTxn (26)           0-4   v4 only tells that the client knows TRANSACTION_ABORTABLE
                            (never answered here): served as v3; v5 (an epoch bump
                            per transaction, KIP-890 part 2) not served
DescribeTransactions  0
(65)
ListTransactions (66) 0-1   state, producer id and (v1) duration filters
===================== ===== ======================================================

Errors: the coordinator's PRODUCER_FENCED goes to request versions that predate it
(InitProducerId < 4, AddPartitionsToTxn/AddOffsetsToTxn/EndTxn < 2) as
INVALID_PRODUCER_EPOCH, as Kafka's KafkaApis does (KIP-588).

Authorization (an authorizer configured), Kafka's rules: InitProducerId, AddPartitionsToTxn,
AddOffsetsToTxn and EndTxn need WRITE on the TRANSACTIONAL_ID (else
TRANSACTIONAL_ID_AUTHORIZATION_FAILED); AddPartitionsToTxn also WRITE on each topic
(TOPIC_AUTHORIZATION_FAILED, the other partitions OPERATION_NOT_ATTEMPTED);
AddOffsetsToTxn also READ on the group (GROUP_AUTHORIZATION_FAILED); FindCoordinator and
DescribeTransactions need DESCRIBE on the TRANSACTIONAL_ID; ListTransactions lists only
ids the caller may DESCRIBE; DescribeTransactions lists only topics it may DESCRIBE.

TxnOffsetCommit (28) v0-3 (``on_txn_offset_commit``: WRITE on the TRANSACTIONAL_ID,
READ on the group and on each topic): the group coordinator appends Kafka's
transactional batch without a sequence (taken as the coordinator's own append,
``coordinator_origin``); the transaction's marker makes the offsets visible or drops
them (``GroupCoordinator.complete_transaction``, called by the broker's marker writer).
"""

from __future__ import annotations

import datetime
from collections.abc import Awaitable
from typing import Any, Protocol, TypeVar

from tidewater.broker.clock import wall_ms
from tidewater.broker.group import service as group_service
from tidewater.broker.group.coordinator import (
    CoordinatorError,
    CoordinatorNode,
    GroupCoordinator,
    partition_for,
)
from tidewater.broker.kafka.codec import RequestBody, RequestHead, milliseconds
from tidewater.broker.kafka.coordinator_api_keys import (
    ADD_OFFSETS_TO_TXN,
    ADD_PARTITIONS_TO_TXN,
    DESCRIBE_TRANSACTIONS,
    END_TXN,
    LIST_TRANSACTIONS,
    TXN_OFFSET_COMMIT,
    TXN_VERSIONS,
)
from tidewater.broker.replicas.metadata_cache import MetadataCache
from tidewater.broker.storage.topics import CONSUMER_OFFSETS_TOPIC
from tidewater.broker.txn.coordinator import TransactionCoordinator
from tidewater.broker.txn.state import COMPLETE, CodeAnswer, TxnState
from tidewater.proto import acls
from tidewater.proto import tidewater_pb2 as pb
from tidewater.proto.errors import InvariantViolation

TRANSACTION_KEY_TYPE = 1

# The first version of each API that knows PRODUCER_FENCED (KIP-588).
PRODUCER_FENCED_FROM = {ADD_PARTITIONS_TO_TXN: 2, ADD_OFFSETS_TO_TXN: 2, END_TXN: 2,
                        TXN_OFFSET_COMMIT: 3, 22: 4}


class TxnServices(Protocol):
    """What the transaction APIs reach of ``apis.Services``."""

    @property
    def txn_coordinator(self) -> TransactionCoordinator | None: ...

    @property
    def group_coordinator(self) -> GroupCoordinator | None: ...

    @property
    def metadata_cache(self) -> MetadataCache: ...

    def allowed(self, operation: int, resource_type: int, name: str) -> bool: ...


def _coordinator(s: TxnServices) -> TransactionCoordinator:
    """The broker's transaction coordinator (a listener built without one serves no
    transaction API: the request fails and the connection closes)."""
    if s.txn_coordinator is None:
        raise LookupError("no transaction coordinator on this listener")
    return s.txn_coordinator


def wire_code(head: RequestHead, code: pb.ErrorCode) -> pb.ErrorCode:
    """PRODUCER_FENCED as a request of this version understands it."""
    if code == pb.PRODUCER_FENCED and head.api_version < PRODUCER_FENCED_FROM.get(
            head.api_key, 0):
        return pb.INVALID_PRODUCER_EPOCH
    return code


def _may_write(s: TxnServices, transactional_id: str) -> bool:
    return s.allowed(acls.WRITE, acls.TRANSACTIONAL_ID, transactional_id)


_T = TypeVar("_T")


def _value(value: _T) -> Awaitable[_T]:
    async def answer() -> _T:
        return value
    return answer()


def _done(value: dict[str, Any]) -> Awaitable[dict[str, Any]]:
    return _value(value)


async def _code_of(pending: Awaitable[object]) -> pb.ErrorCode:
    answer = await pending
    if not isinstance(answer, CodeAnswer):
        raise InvariantViolation(f"a transaction request answered with {answer!r}")
    return answer.error_code


# ---------------------------------------------------------------- FindCoordinator

async def find_txn_coordinator(s: TxnServices, key: str, listener: str,
                               deadline: float | None = None) -> CoordinatorNode:
    if not s.allowed(acls.DESCRIBE, acls.TRANSACTIONAL_ID, key):
        return CoordinatorNode(pb.TRANSACTIONAL_ID_AUTHORIZATION_FAILED)
    return await _coordinator(s).find_coordinator(key, listener, deadline)


# ---------------------------------------------------------------- InitProducerId

async def init_transactional_producer(s: TxnServices, transactional_id: str,
                                      transaction_timeout_ms: int, producer_id: int,
                                      producer_epoch: int) -> tuple[pb.ErrorCode, int, int]:
    """InitProducerId with a transactional id, for Kafka's API and gRPC's: (error code,
    producer id, epoch)."""
    if not _may_write(s, transactional_id):
        return pb.TRANSACTIONAL_ID_AUTHORIZATION_FAILED, -1, -1
    result = await _coordinator(s).init_producer_id(
        transactional_id, transaction_timeout_ms, producer_id, producer_epoch)
    return result.error_code, result.producer_id, result.producer_epoch


def on_init_transactional_producer(s: TxnServices, head: RequestHead, body: RequestBody
                                   ) -> Awaitable[dict[str, Any]]:
    async def answer() -> dict[str, Any]:
        code, producer_id, epoch = await init_transactional_producer(
            s, str(body.transactional_id), milliseconds(body.transaction_timeout),
            int(getattr(body, "producer_id", -1)), int(getattr(body, "producer_epoch", -1)))
        return {"throttle_time": 0, "error_code": wire_code(head, code),
                "producer_id": producer_id, "producer_epoch": epoch}
    return answer()


# ---------------------------------------------------------------- AddPartitionsToTxn

TxnPartitionCodes = dict[tuple[str, int], pb.ErrorCode]


def add_partitions_to_txn(s: TxnServices, transactional_id: str, producer_id: int,
                          producer_epoch: int, wanted: list[tuple[str, int]], *,
                          by_broker: bool = False, verify_only: bool = False
                          ) -> Awaitable[TxnPartitionCodes]:
    """AddPartitionsToTxn for Kafka's API and gRPC's: each partition's code once the
    coordinator's state is durable. ``by_broker``: v4+, a broker's request (CLUSTER_ACTION
    checked by the caller; no WRITE on the transactional id needed); ``verify_only``:
    KIP-890's question, answered from the state as it is, nothing written."""
    if not by_broker and not _may_write(s, transactional_id):
        return _value({tp: pb.TRANSACTIONAL_ID_AUTHORIZATION_FAILED for tp in wanted})
    refused: TxnPartitionCodes = {}
    for topic, partition in wanted:
        if not s.allowed(acls.WRITE, acls.TOPIC, topic):
            refused[(topic, partition)] = pb.TOPIC_AUTHORIZATION_FAILED
        elif s.metadata_cache.partition_state(topic, partition) is None:
            refused[(topic, partition)] = pb.UNKNOWN_TOPIC_OR_PARTITION
    if refused:
        return _value({tp: refused.get(tp, pb.OPERATION_NOT_ATTEMPTED) for tp in wanted})
    if verify_only:
        return _value(_coordinator(s).verify_partitions(transactional_id, producer_id,
                                                        producer_epoch, wanted))
    try:
        pending = _coordinator(s).request(
            transactional_id, lambda state, token, now_ms: state.add_partitions(
                token, now_ms, transactional_id=transactional_id, producer_id=producer_id,
                producer_epoch=producer_epoch, partitions=wanted))
    except CoordinatorError as e:
        return _value({tp: e.error_code for tp in wanted})

    async def answer() -> TxnPartitionCodes:
        code = await _code_of(pending)
        return {tp: code for tp in wanted}
    return answer()


async def on_add_partitions_to_txn(s: TxnServices, head: RequestHead, body: RequestBody
                                   ) -> Awaitable[dict[str, Any]]:
    if head.api_version >= 4:
        return _on_add_partitions_batched(s, head, body)
    wanted = [(str(t.name), int(p)) for t in body.v3_and_below_topics for p in t.partitions]
    pending = add_partitions_to_txn(s, str(body.v3_and_below_transactional_id),
                                    int(body.v3_and_below_producer_id),
                                    int(body.v3_and_below_producer_epoch), wanted)

    async def answer() -> dict[str, Any]:
        by_topic: dict[str, list[dict[str, Any]]] = {}
        for (topic, partition), code in (await pending).items():
            by_topic.setdefault(topic, []).append(
                {"partition_index": partition, "partition_error_code": wire_code(head, code)})
        return {"throttle_time": 0, "results_by_topic_v3_and_below": [
            {"name": topic, "results_by_partition": parts} for topic, parts in by_topic.items()]}
    return answer()


def _on_add_partitions_batched(s: TxnServices, head: RequestHead, body: RequestBody
                               ) -> Awaitable[dict[str, Any]]:
    """AddPartitionsToTxn v4-5 (KIP-890): brokers only (CLUSTER_ACTION on the cluster,
    else the request's error_code is CLUSTER_AUTHORIZATION_FAILED), any number of
    transactions, each added or (``verify_only``) verified."""
    if not s.allowed(acls.CLUSTER_ACTION, acls.CLUSTER, acls.CLUSTER_NAME):
        return _done({"throttle_time": 0, "error_code": pb.CLUSTER_AUTHORIZATION_FAILED,
                      "results_by_transaction": []})
    pending = [(str(txn.transactional_id), add_partitions_to_txn(
        s, str(txn.transactional_id), int(txn.producer_id), int(txn.producer_epoch),
        [(str(t.name), int(p)) for t in txn.topics for p in t.partitions],
        by_broker=True, verify_only=bool(txn.verify_only))) for txn in body.transactions]

    async def answer() -> dict[str, Any]:
        results = []
        for transactional_id, codes in pending:
            by_topic: dict[str, list[dict[str, Any]]] = {}
            for (topic, partition), code in (await codes).items():
                by_topic.setdefault(topic, []).append(
                    {"partition_index": partition,
                     "partition_error_code": wire_code(head, code)})
            results.append({"transactional_id": transactional_id, "topic_results": [
                {"name": t, "results_by_partition": p} for t, p in by_topic.items()]})
        return {"throttle_time": 0, "error_code": pb.NONE, "results_by_transaction": results}
    return answer()


# ---------------------------------------------------------------- AddOffsetsToTxn

def add_offsets_to_txn(s: TxnServices, transactional_id: str, producer_id: int,
                       producer_epoch: int, group_id: str) -> Awaitable[pb.ErrorCode]:
    """AddOffsetsToTxn for Kafka's API and gRPC's: the group's ``__consumer_offsets``
    partition joins the transaction."""
    if not _may_write(s, transactional_id):
        return _value(pb.TRANSACTIONAL_ID_AUTHORIZATION_FAILED)
    if not s.allowed(acls.READ, acls.GROUP, group_id):
        return _value(pb.GROUP_AUTHORIZATION_FAILED)
    groups = s.group_coordinator
    if groups is None:
        raise LookupError("no group coordinator on this listener")
    offsets_partition = (CONSUMER_OFFSETS_TOPIC, partition_for(group_id,
                                                               groups.partition_count()))
    try:
        pending = _coordinator(s).request(
            transactional_id, lambda state, token, now_ms: state.add_partitions(
                token, now_ms, transactional_id=transactional_id,
                producer_id=producer_id, producer_epoch=producer_epoch,
                partitions=[offsets_partition]))
    except CoordinatorError as e:
        return _value(e.error_code)
    return _code_of(pending)


async def on_add_offsets_to_txn(s: TxnServices, head: RequestHead, body: RequestBody
                                ) -> Awaitable[dict[str, Any]]:
    pending = add_offsets_to_txn(s, str(body.transactional_id), int(body.producer_id),
                                 int(body.producer_epoch), str(body.group_id))

    async def answer() -> dict[str, Any]:
        return {"throttle_time": 0, "error_code": wire_code(head, await pending)}
    return answer()


# ---------------------------------------------------------------- EndTxn

def end_txn(s: TxnServices, transactional_id: str, producer_id: int, producer_epoch: int,
            committed: bool) -> Awaitable[pb.ErrorCode]:
    """EndTxn for Kafka's API and gRPC's: answered once PrepareCommit/PrepareAbort is
    durable (the markers follow)."""
    if not _may_write(s, transactional_id):
        return _value(pb.TRANSACTIONAL_ID_AUTHORIZATION_FAILED)
    try:
        pending = _coordinator(s).request(
            transactional_id, lambda state, token, now_ms: state.end_txn(
                token, now_ms, transactional_id=transactional_id,
                producer_id=producer_id, producer_epoch=producer_epoch, committed=committed))
    except CoordinatorError as e:
        return _value(e.error_code)
    return _code_of(pending)


async def on_end_txn(s: TxnServices, head: RequestHead, body: RequestBody
                     ) -> Awaitable[dict[str, Any]]:
    pending = end_txn(s, str(body.transactional_id), int(body.producer_id),
                      int(body.producer_epoch), bool(body.committed))

    async def answer() -> dict[str, Any]:
        return {"throttle_time": 0, "error_code": wire_code(head, await pending)}
    return answer()


# ---------------------------------------------------------------- DescribeTransactions

def _timestamp(epoch_ms: int) -> datetime.datetime:
    """kio's type of an int64 timestamp; Kafka's -1 (no transaction open) included,
    which kio's ``None`` cannot carry."""
    return datetime.datetime.fromtimestamp(epoch_ms / 1000, datetime.UTC)


async def on_describe_transactions(s: TxnServices, head: RequestHead, body: RequestBody
                                   ) -> Awaitable[dict[str, Any]]:
    described = []
    for raw in body.transactional_ids:
        transactional_id = str(raw)
        entry: dict[str, Any] = {"transactional_id": transactional_id, "transaction_state": "",
                                 "transaction_timeout": 0,
                                 "transaction_start_time": _timestamp(-1),
                                 "producer_id": -1, "producer_epoch": -1, "topics": []}
        if not s.allowed(acls.DESCRIBE, acls.TRANSACTIONAL_ID, transactional_id):
            described.append({**entry, "error_code": pb.TRANSACTIONAL_ID_AUTHORIZATION_FAILED})
            continue
        try:
            md = _coordinator(s).describe(transactional_id)
        except CoordinatorError as e:
            described.append({**entry, "error_code": e.error_code})
            continue
        if md is None or md.current.producer_epoch < 0:
            described.append({**entry, "error_code": pb.TRANSACTIONAL_ID_NOT_FOUND})
            continue
        cur = md.current
        by_topic: dict[str, list[int]] = {}
        for topic, partition in sorted(cur.partitions):
            if s.allowed(acls.DESCRIBE, acls.TOPIC, topic):
                by_topic.setdefault(topic, []).append(partition)
        described.append({
            **entry, "error_code": pb.NONE, "transaction_state": md.state.kafka_name,
            "transaction_timeout": cur.timeout_ms,
            "transaction_start_time": _timestamp(cur.start_ms),
            "producer_id": cur.producer_id, "producer_epoch": cur.producer_epoch,
            "topics": [{"topic": t, "partitions": p} for t, p in by_topic.items()]})
    return _done({"throttle_time": 0, "transaction_states": described})


# ---------------------------------------------------------------- ListTransactions

STATE_NAMES = {state.kafka_name: state for state in TxnState}


async def on_list_transactions(s: TxnServices, head: RequestHead, body: RequestBody
                               ) -> Awaitable[dict[str, Any]]:
    coordinator = _coordinator(s)
    wanted_states = {str(n) for n in body.state_filters}
    unknown = sorted(n for n in wanted_states if n not in STATE_NAMES)
    states = {STATE_NAMES[n] for n in wanted_states if n in STATE_NAMES}
    producer_ids = {int(p) for p in body.producer_id_filters}
    duration_ms = int(getattr(body, "duration_filter", -1))
    now = wall_ms()
    listed = []
    for state in coordinator.loaded_states():
        for transactional_id, md in state.txns.items():
            cur = md.current
            if cur.producer_epoch < 0:
                continue  # its first write is not durable yet
            if states and md.state not in states:
                continue
            if producer_ids and cur.producer_id not in producer_ids:
                continue
            if duration_ms >= 0 and (md.state in COMPLETE or cur.start_ms < 0
                                     or now - cur.start_ms < duration_ms):
                continue
            if not s.allowed(acls.DESCRIBE, acls.TRANSACTIONAL_ID, transactional_id):
                continue
            listed.append({"transactional_id": transactional_id,
                           "producer_id": cur.producer_id,
                           "transaction_state": md.state.kafka_name})
    code = pb.COORDINATOR_LOAD_IN_PROGRESS if coordinator.loading() else pb.NONE
    return _done({"throttle_time": 0, "error_code": code, "unknown_state_filters": unknown,
                  "transaction_states": listed})


# ---------------------------------------------------------------- TxnOffsetCommit

def txn_offset_commit(s: TxnServices, transactional_id: str, group_id: str, producer_id: int,
                      producer_epoch: int, generation_id: int, member_id: str,
                      group_instance_id: str | None,
                      offsets: dict[tuple[str, int], tuple[int, int, str]]
                      ) -> Awaitable[TxnPartitionCodes]:
    """TxnOffsetCommit for Kafka's API and gRPC's (``group.service.txn_commit``):
    ``offsets``: (topic, partition) -> (offset, leader epoch, metadata)."""
    if not _may_write(s, transactional_id):
        return _value({tp: pb.TRANSACTIONAL_ID_AUTHORIZATION_FAILED for tp in offsets})
    if not s.allowed(acls.READ, acls.GROUP, group_id):
        return _value({tp: pb.GROUP_AUTHORIZATION_FAILED for tp in offsets})
    refused = {tp: pb.TOPIC_AUTHORIZATION_FAILED for tp in offsets
               if not s.allowed(acls.READ, acls.TOPIC, tp[0])}
    allowed = {tp: v for tp, v in offsets.items() if tp not in refused}
    groups = s.group_coordinator
    if groups is None:
        raise LookupError("no group coordinator on this listener")
    if not allowed:
        return _value(dict(refused))
    pending = group_service.txn_commit(
        groups, s.metadata_cache, group_id=group_id, producer_id=producer_id,
        producer_epoch=producer_epoch, generation_id=generation_id, member_id=member_id,
        group_instance_id=group_instance_id, offsets=allowed)

    async def answer() -> TxnPartitionCodes:
        return {**refused, **(await pending)}
    return answer()


async def on_txn_offset_commit(s: TxnServices, head: RequestHead, body: RequestBody
                               ) -> Awaitable[dict[str, Any]]:
    """TxnOffsetCommit (28) v0-3 on the group coordinator (``group.service.txn_commit``)."""
    wanted = {(str(t.name), int(p.partition_index)): (
        int(p.committed_offset), int(getattr(p, "committed_leader_epoch", -1)),
        p.committed_metadata or "") for t in body.topics for p in t.partitions}
    pending = txn_offset_commit(
        s, str(body.transactional_id), str(body.group_id), int(body.producer_id),
        int(body.producer_epoch), int(getattr(body, "generation_id", -1)),
        str(getattr(body, "member_id", "")), getattr(body, "group_instance_id", None), wanted)

    async def answer() -> dict[str, Any]:
        by_topic: dict[str, list[dict[str, Any]]] = {}
        for (topic, partition), code in (await pending).items():
            by_topic.setdefault(topic, []).append(
                {"partition_index": partition, "error_code": wire_code(head, code)})
        return {"throttle_time": 0, "topics": [{"name": t, "partitions": p}
                                               for t, p in by_topic.items()]}
    return answer()


TXN_HANDLERS = {
    ADD_PARTITIONS_TO_TXN: on_add_partitions_to_txn,
    ADD_OFFSETS_TO_TXN: on_add_offsets_to_txn,
    END_TXN: on_end_txn,
    DESCRIBE_TRANSACTIONS: on_describe_transactions,
    LIST_TRANSACTIONS: on_list_transactions,
    TXN_OFFSET_COMMIT: on_txn_offset_commit,
}
assert set(TXN_HANDLERS) == set(TXN_VERSIONS)
