"""The transaction APIs' translation: authorization, refusals, PRODUCER_FENCED for old
versions, DescribeTransactions and ListTransactions, over the real pure coordinator
state (writes succeed at once)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

import pytest

from tidewater.broker.group.coordinator import partition_for
from tidewater.broker.group.state import GroupCoordinatorState
from tidewater.broker.kafka import txn_apis
from tidewater.broker.kafka.codec import RequestHead, build, request_type
from tidewater.broker.txn.state import Ready, TransactionCoordinatorState, TxnState
from tidewater.proto import acls
from tidewater.proto import tidewater_pb2 as pb

pytestmark = pytest.mark.timeout(30)


class FakeTxnCoordinator:
    def __init__(self) -> None:
        self.state = TransactionCoordinatorState(1)
        self.next_pid = 100

    def _carry_out(self, ready: Ready) -> None:
        for token, answer in ready.replies:
            token.set_result(answer)
        for write in ready.writes:
            self._carry_out(self.state.on_write_done(write.write_id, pb.NONE, 0))

    def request(self, transactional_id: str, call: Any) -> Any:
        token = asyncio.get_running_loop().create_future()
        self._carry_out(call(self.state, token, 1000))
        return token

    async def init_producer_id(self, transactional_id: str, timeout_ms: int, producer_id: int,
                               producer_epoch: int) -> Any:
        self.next_pid += 1
        return await self.request(transactional_id, lambda state, token, now_ms:
                                  state.init_producer_id(
                                      token, now_ms, transactional_id=transactional_id,
                                      transaction_timeout_ms=timeout_ms,
                                      producer_id=producer_id, producer_epoch=producer_epoch,
                                      fresh_producer_id=self.next_pid))

    def describe(self, transactional_id: str) -> Any:
        return self.state.describe(transactional_id)

    def verify_partitions(self, transactional_id: str, producer_id: int, producer_epoch: int,
                          partitions: list[tuple[str, int]]) -> Any:
        return self.state.verify_partitions(
            transactional_id=transactional_id, producer_id=producer_id,
            producer_epoch=producer_epoch, partitions=partitions)

    def loaded_states(self) -> list[TransactionCoordinatorState]:
        return [self.state]

    def loading(self) -> bool:
        return False


class FakeGroups:
    def __init__(self) -> None:
        self.state = GroupCoordinatorState()

    def partition_count(self) -> int:
        return 50

    def request(self, group_id: str, call: Any) -> Any:
        token = asyncio.get_running_loop().create_future()
        ready = call(self.state, token, 1000)
        for write in ready.writes:
            ready.extend(self.state.on_write_done(write.write_id, pb.NONE, 1000))
        for waiting, answer in ready.replies:
            waiting.set_result(answer)
        return token


class FakeMetadata:
    def partition_state(self, topic: str, partition: int) -> pb.PartitionState | None:
        return pb.PartitionState(leader=1) if topic in ("a", "b") and partition < 2 else None


@dataclass
class FakeServices:
    txn_coordinator: FakeTxnCoordinator = field(default_factory=FakeTxnCoordinator)
    group_coordinator: FakeGroups = field(default_factory=FakeGroups)
    metadata_cache: FakeMetadata = field(default_factory=FakeMetadata)
    denied: set[tuple[int, int, str]] = field(default_factory=set)

    def allowed(self, operation: int, resource_type: int, name: str) -> bool:
        return (operation, resource_type, name) not in self.denied


def call(s: FakeServices, api_key: int, version: int, values: dict[str, Any]) -> Any:
    body = build(request_type(api_key, version), values)
    head = RequestHead(api_key, version, 1, "test")
    handler = {22: lambda *a: _async(txn_apis.on_init_transactional_producer(*a)),
               **txn_apis.TXN_HANDLERS}[api_key]

    async def run() -> Any:
        return await (await handler(s, head, body))
    return asyncio.run(run())


async def _async(value: Any) -> Any:
    return value


def init(s: FakeServices, tid: str = "tx", version: int = 4) -> dict[str, Any]:
    return call(s, 22, version, {"transactional_id": tid, "transaction_timeout": 60_000,
                                 "producer_id": -1, "producer_epoch": -1})


def add(s: FakeServices, pid: int, epoch: int, topics: dict[str, list[int]],
        version: int = 3) -> dict[tuple[str, int], int]:
    answer = call(s, 24, version, {
        "v3_and_below_transactional_id": "tx", "v3_and_below_producer_id": pid,
        "v3_and_below_producer_epoch": epoch,
        "v3_and_below_topics": [{"name": t, "partitions": p} for t, p in topics.items()]})
    return {(t["name"], r["partition_index"]): r["partition_error_code"]
            for t in answer["results_by_topic_v3_and_below"] for r in t["results_by_partition"]}


def test_a_transactional_id_the_caller_may_not_write_is_refused_everywhere():
    s = FakeServices(denied={(acls.WRITE, acls.TRANSACTIONAL_ID, "tx")})
    assert init(s)["error_code"] == pb.TRANSACTIONAL_ID_AUTHORIZATION_FAILED
    assert set(add(s, 1, 0, {"a": [0, 1]}).values()) == {pb.TRANSACTIONAL_ID_AUTHORIZATION_FAILED}
    end = call(s, 26, 3, {"transactional_id": "tx", "producer_id": 1, "producer_epoch": 0,
                          "committed": True})
    assert end["error_code"] == pb.TRANSACTIONAL_ID_AUTHORIZATION_FAILED


def test_refused_topics_leave_the_others_not_attempted_and_add_nothing():
    s = FakeServices(denied={(acls.WRITE, acls.TOPIC, "b")})
    answer = init(s)
    pid, epoch = answer["producer_id"], answer["producer_epoch"]
    assert add(s, pid, epoch, {"a": [0, 5], "b": [0]}) == {
        ("a", 0): pb.OPERATION_NOT_ATTEMPTED, ("a", 5): pb.UNKNOWN_TOPIC_OR_PARTITION,
        ("b", 0): pb.TOPIC_AUTHORIZATION_FAILED}
    assert s.txn_coordinator.describe("tx").state == TxnState.EMPTY
    assert add(s, pid, epoch, {"a": [0, 1]}) == {("a", 0): pb.NONE, ("a", 1): pb.NONE}


def test_a_fenced_producer_hears_invalid_producer_epoch_on_versions_before_kip_588():
    s = FakeServices()
    first = init(s)
    init(s)
    old = {"transactional_id": "tx", "producer_id": first["producer_id"],
           "producer_epoch": first["producer_epoch"], "committed": True}
    assert call(s, 26, 1, old)["error_code"] == pb.INVALID_PRODUCER_EPOCH
    assert call(s, 26, 2, old)["error_code"] == pb.PRODUCER_FENCED
    assert set(add(s, first["producer_id"], 0, {"a": [0]}, version=1).values()) == {
        pb.INVALID_PRODUCER_EPOCH}
    retry = call(s, 22, 3, {"transactional_id": "tx", "transaction_timeout": 60_000,
                            "producer_id": first["producer_id"], "producer_epoch": 7})
    assert retry["error_code"] == pb.INVALID_PRODUCER_EPOCH


def test_add_offsets_adds_the_groups_offsets_partition():
    s = FakeServices()
    answer = init(s)
    added = call(s, 25, 3, {"transactional_id": "tx", "producer_id": answer["producer_id"],
                            "producer_epoch": answer["producer_epoch"], "group_id": "g"})
    assert added["error_code"] == pb.NONE
    assert s.txn_coordinator.describe("tx").current.partitions == {
        ("__consumer_offsets", partition_for("g", 50))}
    s.denied.add((acls.READ, acls.GROUP, "g"))
    refused = call(s, 25, 3, {"transactional_id": "tx", "producer_id": answer["producer_id"],
                              "producer_epoch": answer["producer_epoch"], "group_id": "g"})
    assert refused["error_code"] == pb.GROUP_AUTHORIZATION_FAILED


def test_describe_and_list_show_only_what_the_caller_may_describe():
    s = FakeServices(denied={(acls.DESCRIBE, acls.TOPIC, "b")})
    answer = init(s)
    add(s, answer["producer_id"], answer["producer_epoch"], {"a": [1], "b": [0]})
    [state] = call(s, 65, 0, {"transactional_ids": ["tx"]})["transaction_states"]
    assert (state["error_code"], state["transaction_state"]) == (pb.NONE, "Ongoing")
    assert state["topics"] == [{"topic": "a", "partitions": [1]}]
    [missing] = call(s, 65, 0, {"transactional_ids": ["nope"]})["transaction_states"]
    assert missing["error_code"] == pb.TRANSACTIONAL_ID_NOT_FOUND
    listed = call(s, 66, 0, {"state_filters": ["Ongoing"], "producer_id_filters": []})
    assert [t["transactional_id"] for t in listed["transaction_states"]] == ["tx"]
    assert call(s, 66, 0, {"state_filters": ["Empty"], "producer_id_filters": []})[
        "transaction_states"] == []
    s.denied.add((acls.DESCRIBE, acls.TRANSACTIONAL_ID, "tx"))
    assert call(s, 66, 0, {"state_filters": [], "producer_id_filters": []})[
        "transaction_states"] == []


def test_the_brokers_batched_form_verifies_without_writing_and_needs_cluster_action():
    """AddPartitionsToTxn v4-5 (KIP-890): verify_only answers per partition and adds
    nothing; without verify_only the partitions are added; CLUSTER_ACTION required."""
    s = FakeServices()
    answer = init(s)
    pid, epoch = answer["producer_id"], answer["producer_epoch"]
    assert add(s, pid, epoch, {"a": [0]}) == {("a", 0): pb.NONE}

    def batched(version: int, verify_only: bool, topics: dict[str, list[int]]) -> Any:
        return call(s, 24, version, {"transactions": [{
            "transactional_id": "tx", "producer_id": pid, "producer_epoch": epoch,
            "verify_only": verify_only,
            "topics": [{"name": t, "partitions": p} for t, p in topics.items()]}]})

    def codes(answer: Any) -> dict[tuple[str, int], int]:
        assert answer["error_code"] == pb.NONE
        [txn] = answer["results_by_transaction"]
        assert txn["transactional_id"] == "tx"
        return {(t["name"], r["partition_index"]): r["partition_error_code"]
                for t in txn["topic_results"] for r in t["results_by_partition"]}
    for version in (4, 5):
        assert codes(batched(version, True, {"a": [0, 1]})) == {
            ("a", 0): pb.NONE, ("a", 1): pb.INVALID_TXN_STATE}
        assert codes(batched(version, True, {"a": [0], "zz": [0]})) == {
            ("a", 0): pb.OPERATION_NOT_ATTEMPTED, ("zz", 0): pb.UNKNOWN_TOPIC_OR_PARTITION}
    assert s.txn_coordinator.describe("tx").current.partitions == {("a", 0)}
    assert codes(batched(4, False, {"a": [1]})) == {("a", 1): pb.NONE}
    assert s.txn_coordinator.describe("tx").current.partitions == {("a", 0), ("a", 1)}
    s.denied.add((acls.CLUSTER_ACTION, acls.CLUSTER, acls.CLUSTER_NAME))
    refused = batched(5, True, {"a": [0]})
    assert (refused["error_code"], refused["results_by_transaction"]) == (
        pb.CLUSTER_AUTHORIZATION_FAILED, [])


def test_end_txn_v4_commits_as_v3_does():
    s = FakeServices()
    answer = init(s)
    pid, epoch = answer["producer_id"], answer["producer_epoch"]
    assert add(s, pid, epoch, {"a": [0]}) == {("a", 0): pb.NONE}
    end = call(s, 26, 4, {"transactional_id": "tx", "producer_id": pid,
                          "producer_epoch": epoch, "committed": True})
    assert end["error_code"] == pb.NONE
    assert s.txn_coordinator.describe("tx").state == TxnState.PREPARE_COMMIT


def test_the_apis_are_advertised_as_far_as_they_work():
    from tidewater.broker.kafka.apis import HANDLERS, SUPPORTED
    assert {24: (0, 5), 25: (0, 3), 26: (0, 4), 28: (0, 3), 65: (0, 0),
            66: (0, 1)}.items() <= SUPPORTED.items()
    assert 28 in HANDLERS  # TxnOffsetCommit: the log takes the coordinator's batches


def test_txn_offset_commit_holds_offsets_until_the_marker_reaches_the_group():
    s = FakeServices(denied={(acls.READ, acls.TOPIC, "b")})
    answer = call(s, 28, 3, {
        "transactional_id": "tx", "group_id": "g", "producer_id": 5, "producer_epoch": 0,
        "generation_id": -1, "member_id": "", "group_instance_id": None,
        "topics": [{"name": "a", "partitions": [{"partition_index": 0, "committed_offset": 9,
                                                 "committed_leader_epoch": -1,
                                                 "committed_metadata": ""}]},
                   {"name": "b", "partitions": [{"partition_index": 0, "committed_offset": 3,
                                                 "committed_leader_epoch": -1,
                                                 "committed_metadata": ""}]}]})
    codes = {(t["name"], p["partition_index"]): p["error_code"]
             for t in answer["topics"] for p in t["partitions"]}
    assert codes == {("a", 0): pb.NONE, ("b", 0): pb.TOPIC_AUTHORIZATION_FAILED}
    groups = s.group_coordinator.state
    assert groups.fetch_offsets("g", None) == {}
    groups.complete_txn(5, True)
    assert groups.fetch_offsets("g", [("a", 0)])[("a", 0)].offset == 9
