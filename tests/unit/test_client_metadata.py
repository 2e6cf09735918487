"""Bootstrap handling and broker fail-over of MetadataClient, without sockets."""

import pytest

from tidewater.client.metadata import BrokerConnectionError, MetadataClient
from tidewater.proto.errors import RequestTimedOutError


def make_client():
    return MetadataClient("h1:1,h2:2,h3:3")


def test_connection_errors_move_on_and_the_last_good_broker_goes_first():
    client = make_client()
    tried = []

    def call(address):
        tried.append(address)
        if address != ("h3", 3):
            raise BrokerConnectionError("down")
        return "ok"

    assert client.any_broker_call(call) == "ok"
    assert tried == [("h1", 1), ("h2", 2), ("h3", 3)]
    tried.clear()
    assert client.any_broker_call(call) == "ok"
    assert tried == [("h3", 3)]


def test_no_broker_reachable_names_every_address():
    client = make_client()

    def call(address):
        raise BrokerConnectionError("refused")

    with pytest.raises(BrokerConnectionError, match="no broker reachable.*h1:1, h2:2, h3:3"):
        client.any_broker_call(call)


def test_timeouts_move_on_only_when_safe():
    client = make_client()
    tried = []

    def call(address):
        tried.append(address)
        if address == ("h1", 1):
            raise RequestTimedOutError("slow")
        return address

    assert client.any_broker_call(call) == ("h2", 2)
    client._last_good = None
    tried.clear()
    with pytest.raises(RequestTimedOutError):
        client.any_broker_call(call, retry_on_timeout=False)
    assert tried == [("h1", 1)]


# ------------------------------------------------- the periodic refresh never blocks a caller

import threading  # noqa: E402
import time  # noqa: E402

from tidewater.client.metadata import TopicPartition  # noqa: E402
from tidewater.proto import tidewater_pb2 as pb  # noqa: E402


def metadata_answer(leader: int) -> pb.MetadataResponse:
    return pb.MetadataResponse(
        brokers=[pb.BrokerEndpoint(broker_id=i, host=f"h{i}", port=i) for i in (1, 2, 3)],
        topics=[pb.TopicMetadata(name="t", partitions=[
            pb.PartitionMetadata(partition=0, leader=leader, leader_epoch=leader,
                                 replicas=[1, 2, 3], isr=[1, 2, 3])])])


class GatedBrokers:
    """Stands in for ``any_broker_call``: answers with the leader set now, after the
    next ``gate`` is opened (a broker that hangs until then)."""

    def __init__(self, leader: int):
        self.leader = leader
        self.calls = 0
        self.gates: list[threading.Event] = []
        self.fail = False

    def hold_next(self) -> threading.Event:
        gate = threading.Event()
        self.gates.append(gate)
        return gate

    def __call__(self, call, **_kwargs):
        self.calls += 1
        leader = self.leader
        if self.gates:
            assert self.gates.pop(0).wait(10)
        if self.fail:
            raise BrokerConnectionError("down")
        return metadata_answer(leader)


def aged_client() -> tuple[GatedBrokers, MetadataClient]:
    """A client whose snapshot (leader 1) is older than its metadata_max_age_ms."""
    brokers = GatedBrokers(leader=1)
    client = MetadataClient("h1:1", metadata_max_age_ms=50)
    client.any_broker_call = brokers
    client.add_topics(["t"])
    client.refresh()
    age(client)
    return brokers, client


def until(predicate, what: str) -> None:
    deadline = time.monotonic() + 10
    while not predicate():
        assert time.monotonic() < deadline, f"never {what}"
        time.sleep(0.005)


def wait_background_done(client: MetadataClient) -> None:
    until(lambda: client._background is None, "the background refresh ended")


def wait_calls(brokers: GatedBrokers, calls: int) -> None:
    until(lambda: brokers.calls >= calls, f"{calls} Metadata calls")


def age(client: MetadataClient) -> None:
    until(lambda: client.is_aged(client.snapshot), "the snapshot aged")


def background_refresh_held(client: MetadataClient, brokers: GatedBrokers) -> threading.Event:
    """Start a background refresh that hangs at the broker until the returned gate opens."""
    gate = brokers.hold_next()
    client.refresh_in_background()
    wait_calls(brokers, brokers.calls + 1)
    return gate


def release(client: MetadataClient, gate: threading.Event) -> None:
    """Let the held refresh answer, and wait until it has ended."""
    gate.set()
    wait_background_done(client)


def test_an_aged_snapshot_is_used_while_a_background_refresh_hangs():
    brokers, client = aged_client()
    brokers.leader = 2
    gate = brokers.hold_next()
    # The broker asked hangs: every lookup still answers at once, from the aged snapshot.
    assert client.cached_leader_for(TopicPartition("t", 0)).broker_id == 1
    assert client.leader_for(TopicPartition("t", 0)).broker_id == 1
    assert client.cached_partitions("t") is not None
    wait_calls(brokers, 2)  # the background refresh reached the hanging broker
    for _ in range(3):
        assert client.cached_leader_for(TopicPartition("t", 0)).broker_id == 1
    assert brokers.calls == 2  # one refresh in flight, however many lookups
    release(client, gate)
    assert client.leader_for(TopicPartition("t", 0)).broker_id == 2


def test_an_invalidation_during_a_refresh_keeps_the_snapshot_stale():
    brokers, client = aged_client()
    gate = background_refresh_held(client, brokers)  # asks before the leader moves...
    client.invalidate()             # ...and a produce answer then says it moved
    brokers.leader = 3
    release(client, gate)
    # The answer sent before the move must not clear the staleness: the next lookup asks again.
    assert client.leader_for(TopicPartition("t", 0)).broker_id == 3


def test_of_two_overlapping_refreshes_the_later_asked_is_kept():
    brokers, client = aged_client()
    gate = background_refresh_held(client, brokers)  # asked first, answers last: leader 1
    brokers.leader = 2
    client.refresh()                  # asked later, answers first with leader 2
    release(client, gate)
    assert client.snapshot.topics["t"].partitions[0].leader == 2


def test_a_failed_background_refresh_backs_off_and_a_closed_client_starts_none():
    brokers, client = aged_client()
    brokers.fail = True
    client.refresh_in_background()
    wait_background_done(client)
    calls = brokers.calls
    client.refresh_in_background()  # within the backoff: not asked again
    assert client._background is None and brokers.calls == calls
    assert client.cached_leader_for(TopicPartition("t", 0)).broker_id == 1  # still usable
    client._background_not_before_s = 0.0
    client.pool.close()
    client.refresh_in_background()  # closed: a refresh would open channels nobody closes
    assert client._background is None and brokers.calls == calls
