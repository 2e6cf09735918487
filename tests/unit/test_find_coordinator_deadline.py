"""FindCoordinator v4 names several keys; while the coordinator topic cannot be created
(here the controller refuses every CreateTopics) the keys share one wait, the request's,
rather than waiting one after another: the connection's later requests queue behind
the answer."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import pytest

from tidewater.broker.coordination import partitioned
from tidewater.broker.group.coordinator import GroupCoordinator
from tidewater.broker.kafka import group_apis, txn_apis
from tidewater.broker.kafka.codec import RequestHead, build, request_type
from tidewater.broker.kafka.coordinator_api_keys import FIND_COORDINATOR
from tidewater.proto import tidewater_pb2 as pb
from tidewater.proto.supervisor import TaskSupervisor

pytestmark = pytest.mark.timeout(30)

WAIT_S = 0.5
KEYS = [f"g{i}" for i in range(6)]


class NoTopics:
    """Metadata in which the coordinator topic never appears."""

    def partition_state(self, topic: str, partition: int) -> None:
        return None

    def metadata_response(self, topics: list[str], listener: str) -> Any:
        return SimpleNamespace(brokers=[1])


class UnreachableController:
    def __init__(self) -> None:
        self.create_calls = 0

    async def CreateTopics(self, request: Any, context: Any) -> Any:
        self.create_calls += 1
        raise ConnectionError("controller unreachable")


def group_coordinator(controller: UnreachableController) -> GroupCoordinator:
    config = SimpleNamespace(broker_id=1, group_min_session_timeout_ms=1000,
                             group_max_session_timeout_ms=60000,
                             group_initial_rebalance_delay_ms=0,
                             offsets_topic_num_partitions=4,
                             offsets_topic_replication_factor=1,
                             offsets_commit_timeout_ms=1000, offsets_retention_minutes=60,
                             offsets_retention_check_interval_ms=1000)
    return GroupCoordinator(replica_manager=SimpleNamespace(partitions={}),
                            metadata_cache=NoTopics(), controller=controller, config=config,
                            supervisor=TaskSupervisor(on_fatal=lambda error: None))


def services(group: Any = None, txn: Any = None) -> Any:
    return SimpleNamespace(group_coordinator=group, txn_coordinator=txn,
                           metadata_cache=NoTopics(), listener_name="PLAINTEXT",
                           client_host="127.0.0.1", allowed=lambda *a: True)


async def find(s: Any, key_type: int) -> tuple[dict[str, Any], float]:
    body = build(request_type(FIND_COORDINATOR, 4),
                 {"key_type": key_type, "coordinator_keys": KEYS})
    head = RequestHead(FIND_COORDINATOR, 4, 1, "test")
    loop = asyncio.get_running_loop()
    started = loop.time()
    answer = await (await group_apis.on_find_coordinator(s, head, body))
    return answer, loop.time() - started


async def test_a_groups_keys_share_one_wait_while_the_topic_cannot_be_created(monkeypatch):
    monkeypatch.setattr(partitioned, "FIRST_USE_WAIT_S", WAIT_S)
    monkeypatch.setattr(partitioned, "FIRST_USE_POLL_S", 0.01)
    controller = UnreachableController()
    answer, elapsed_s = await find(services(group=group_coordinator(controller)),
                                   group_apis.GROUP_KEY_TYPE)
    assert [c["key"] for c in answer["coordinators"]] == KEYS
    assert {c["error_code"] for c in answer["coordinators"]} == {pb.COORDINATOR_NOT_AVAILABLE}
    assert controller.create_calls >= 1  # the creation was tried, and kept failing
    # One wait is WAIT_S; a wait per key would be len(KEYS) * WAIT_S = 3 s.
    assert WAIT_S <= elapsed_s < 3 * WAIT_S


class RecordingTxnCoordinator:
    def __init__(self) -> None:
        self.deadlines: list[float | None] = []

    async def find_coordinator(self, key: str, listener: str,
                               deadline: float | None = None) -> Any:
        self.deadlines.append(deadline)
        return partitioned.CoordinatorNode(pb.COORDINATOR_NOT_AVAILABLE)


async def test_a_transactions_keys_are_given_the_requests_one_deadline():
    txn = RecordingTxnCoordinator()
    answer, _ = await find(services(txn=txn), txn_apis.TRANSACTION_KEY_TYPE)
    assert len(answer["coordinators"]) == len(KEYS)
    assert len(txn.deadlines) == len(KEYS)
    assert len(set(txn.deadlines)) == 1 and txn.deadlines[0] is not None
