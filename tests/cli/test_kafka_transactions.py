"""Issue 27, the transaction coordinator through real processes: confluent-kafka's
transactional producer (init, fencing, empty commit and abort), DescribeTransactions and
ListTransactions on the Kafka listener, the coordinator's timeout abort, and the
coordinator moving when the leader of its ``__transaction_state`` partition is killed;
kafka-python's transactional producer and admin client.

Markers are written by partition leaders (WriteTxnMarkers); a decided transaction is
Prepare* until they are, then Complete*: the tests accept either where the moment is not
theirs to choose. Records in transactions: test_kafka_txn_e2e.py."""

from __future__ import annotations

import socket
import struct
from typing import Any

import pytest
from cluster_fixtures import run_tide, start_cluster, stop_cluster, wait_for

from tidewater.broker.group.coordinator import partition_for
from tidewater.broker.kafka import codec

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

confluent_kafka = pytest.importorskip("confluent_kafka")

FIND_COORDINATOR, INIT_PRODUCER_ID, ADD_PARTITIONS_TO_TXN, END_TXN = 10, 22, 24, 26
DESCRIBE_TRANSACTIONS, LIST_TRANSACTIONS = 65, 66
ABORTED = ("PrepareAbort", "CompleteAbort")  # PrepareAbort until the markers are written


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    c = start_cluster(tmp_path_factory.mktemp("txn"), 3, "min.insync.replicas=2",
                      "transaction.state.log.num.partitions=5",
                      "transaction.abort.timed.out.transaction.cleanup.interval.ms=300")
    c.kafka = c.manifest()["kafka_bootstrap"]  # type: ignore[attr-defined]
    assert c.tide("topics", "create", "orders", "--partitions", "2",
                  "--replication-factor", "3").returncode == 0
    yield c
    stop_cluster(c)


def call(address: str, api_key: int, version: int, values: dict[str, Any]) -> Any:
    """One raw Kafka request and its decoded answer (DescribeTransactions by
    ``read_described``: kio refuses its -1 start time, which Kafka sends too)."""
    host, port = address.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=15) as s:
        s.sendall(codec.encode_request(api_key, version, 7, values))
        size = b""
        while len(size) < 4:
            chunk = s.recv(4 - len(size))
            assert chunk, "connection closed before an answer"
            size += chunk
        (length,) = struct.unpack(">i", size)
        frame = b""
        while len(frame) < length:
            chunk = s.recv(length - len(frame))
            assert chunk, "connection closed mid-answer"
            frame += chunk
    if api_key == DESCRIBE_TRANSACTIONS:
        return read_described(frame)
    return codec.decode_response(api_key, version, frame)[1]


class _Frame:
    def __init__(self, data: bytes, position: int):
        self.data, self.position = data, position

    def fixed(self, fmt: str) -> int:
        (value,) = struct.unpack_from(fmt, self.data, self.position)
        self.position += struct.calcsize(fmt)
        return int(value)

    def uvarint(self) -> int:
        value = shift = 0
        while True:
            byte = self.data[self.position]
            self.position += 1
            value |= (byte & 0x7F) << shift
            if not byte & 0x80:
                return value
            shift += 7

    def text(self) -> str:
        size = self.uvarint() - 1
        self.position += size
        return self.data[self.position - size:self.position].decode()

    def no_tags(self) -> None:
        assert self.uvarint() == 0


def read_described(frame: bytes) -> Any:
    """DescribeTransactionsResponse v0 (flexible) as a namespace per transaction."""
    from types import SimpleNamespace
    r = _Frame(frame, 5)  # correlation id, empty header tags
    r.fixed(">i")  # throttle time
    states = []
    for _ in range(r.uvarint() - 1):
        state = SimpleNamespace(error_code=r.fixed(">h"), transactional_id=r.text(),
                                transaction_state=r.text(), transaction_timeout_ms=r.fixed(">i"),
                                transaction_start_time_ms=r.fixed(">q"),
                                producer_id=r.fixed(">q"), producer_epoch=r.fixed(">h"),
                                topics=[])
        for _ in range(r.uvarint() - 1):
            topic = r.text()
            partitions = [r.fixed(">i") for _ in range(r.uvarint() - 1)]
            r.no_tags()
            state.topics.append(SimpleNamespace(topic=topic, partitions=partitions))
        r.no_tags()
        states.append(state)
    r.no_tags()
    assert r.position == len(frame)
    return SimpleNamespace(transaction_states=states)


def coordinator_of(bootstrap: str, transactional_id: str) -> tuple[int, str]:
    """(node id, host:port) of the id's coordinator, once there is one."""
    def found() -> tuple[int, str] | None:
        for address in bootstrap.split(","):
            try:
                answer = call(address, FIND_COORDINATOR, 4, {
                    "key_type": 1, "coordinator_keys": [transactional_id]})
            except OSError:
                continue
            [c] = answer.coordinators
            if c.error_code == 0:
                return int(c.node_id), f"{c.host}:{c.port}"
        return None
    return wait_for(found, f"a coordinator for {transactional_id}")


def describe(bootstrap: str, transactional_id: str) -> Any:
    _, address = coordinator_of(bootstrap, transactional_id)
    answer = call(address, DESCRIBE_TRANSACTIONS, 0, {"transactional_ids": [transactional_id]})
    [state] = answer.transaction_states
    return state


def producer(c, transactional_id: str, **extra: Any) -> Any:
    return confluent_kafka.Producer({"bootstrap.servers": c.kafka,
                                     "transactional.id": transactional_id, **extra})


def test_init_then_empty_commit_and_abort_succeed(cluster):
    p = producer(cluster, "tx-empty")
    p.init_transactions(60)
    for _ in range(2):
        p.begin_transaction()
        p.commit_transaction(30)
        p.begin_transaction()
        p.abort_transaction(30)
    state = describe(cluster.kafka, "tx-empty")
    assert state.error_code == 0 and state.transaction_state == "Empty"
    assert state.producer_epoch == 0 and state.producer_id >= 0


def test_a_second_producer_fences_the_first(cluster):
    first = producer(cluster, "tx-zombie")
    first.init_transactions(60)
    before = describe(cluster.kafka, "tx-zombie")
    second = producer(cluster, "tx-zombie")
    second.init_transactions(60)
    after = describe(cluster.kafka, "tx-zombie")
    assert (after.producer_id, after.producer_epoch) == (before.producer_id,
                                                          before.producer_epoch + 1)
    first.begin_transaction()
    # AddPartitionsToTxn goes first and is refused: the record is never sent.
    first.produce("orders", b"from the zombie")
    with pytest.raises(confluent_kafka.KafkaException) as raised:
        first.commit_transaction(30)
    error = raised.value.args[0]
    assert error.fatal() or error.code() in (confluent_kafka.KafkaError._FENCED,
                                             confluent_kafka.KafkaError.PRODUCER_FENCED)
    assert "fenced" in str(error).lower()
    second.begin_transaction()
    second.abort_transaction(30)


def test_describe_and_list_transactions_answer_on_the_kafka_listener(cluster):
    p = producer(cluster, "tx-listed", **{"transaction.timeout.ms": 45_000})
    p.init_transactions(60)
    state = describe(cluster.kafka, "tx-listed")
    assert (state.error_code, state.transaction_state) == (0, "Empty")
    assert state.transaction_timeout_ms == 45_000 and state.transaction_start_time_ms == -1
    node, address = coordinator_of(cluster.kafka, "tx-listed")
    listed = call(address, LIST_TRANSACTIONS, 1, {"state_filters": ["Empty", "Bogus"],
                                                  "producer_id_filters": []})
    assert listed.error_code == 0 and list(listed.unknown_state_filters) == ["Bogus"]
    assert ("tx-listed", state.producer_id) in {
        (t.transactional_id, t.producer_id) for t in listed.transaction_states}
    unknown = call(address, DESCRIBE_TRANSACTIONS, 0, {"transactional_ids": ["tx-never"]})
    assert unknown.transaction_states[0].error_code in (16, 105)  # NOT_COORDINATOR / NOT_FOUND


def test_an_open_transaction_past_its_timeout_is_aborted_by_the_coordinator(cluster):
    _, address = coordinator_of(cluster.kafka, "tx-timeout")
    init = wait_for(lambda: (a := call(address, INIT_PRODUCER_ID, 4, {
        "transactional_id": "tx-timeout", "transaction_timeout": 1500,
        "producer_id": -1, "producer_epoch": -1})).error_code == 0 and a,
        "InitProducerId")
    added = call(address, ADD_PARTITIONS_TO_TXN, 3, {
        "v3_and_below_transactional_id": "tx-timeout",
        "v3_and_below_producer_id": init.producer_id,
        "v3_and_below_producer_epoch": init.producer_epoch,
        "v3_and_below_topics": [{"name": "orders", "partitions": [0, 1]}]})
    codes = {r.partition_index: r.partition_error_code
             for t in added.results_by_topic_v3_and_below for r in t.results_by_partition}
    assert codes == {0: 0, 1: 0}
    ongoing = describe(cluster.kafka, "tx-timeout")
    assert ongoing.transaction_state == "Ongoing" and ongoing.transaction_start_time_ms > 0
    assert {(t.topic, tuple(t.partitions)) for t in ongoing.topics} == {("orders", (0, 1))}
    aborted = wait_for(lambda: (s := describe(cluster.kafka, "tx-timeout")).transaction_state
                       in ABORTED and s, "the timeout abort", timeout_s=30)
    assert aborted.producer_epoch == init.producer_epoch + 1  # the producer is fenced
    end = call(address, END_TXN, 3, {"transactional_id": "tx-timeout",
                                     "producer_id": init.producer_id,
                                     "producer_epoch": init.producer_epoch, "committed": True})
    assert end.error_code == 90  # PRODUCER_FENCED
    end_v1 = call(address, END_TXN, 1, {"transactional_id": "tx-timeout",
                                        "producer_id": init.producer_id,
                                        "producer_epoch": init.producer_epoch,
                                        "committed": True})
    assert end_v1.error_code == 47  # INVALID_PRODUCER_EPOCH: v1 predates PRODUCER_FENCED


def test_the_coordinator_moves_when_its_partition_leader_is_killed(cluster):
    p = producer(cluster, "tx-moving")
    p.init_transactions(60)
    before = describe(cluster.kafka, "tx-moving")
    victim, address = coordinator_of(cluster.kafka, "tx-moving")
    # A decided transaction on the same __transaction_state partition: its markers are
    # due when the coordinator dies, and the next one must send them again.
    prepared = next(f"tx-prepared-{i}" for i in range(1000)
                    if partition_for(f"tx-prepared-{i}", 5) == partition_for("tx-moving", 5))
    decided = prepare_commit(address, prepared)
    assert run_tide("cluster", "kill", str(victim), "--signal", "KILL",
                    "--data-dir", str(cluster.data_dir)).returncode == 0
    alive = ",".join(a for a in cluster.kafka.split(",")
                     if not _is_node(cluster, a, victim))

    def moved() -> Any:
        node, address = coordinator_of(alive, "tx-moving")
        if node == victim:
            return None
        answer = call(address, DESCRIBE_TRANSACTIONS, 0, {"transactional_ids": ["tx-moving"]})
        [state] = answer.transaction_states
        return state if state.error_code == 0 else None
    after = wait_for(moved, "the coordinator on a surviving broker", timeout_s=90)
    assert (after.producer_id, after.producer_epoch, after.transaction_state) == (
        before.producer_id, before.producer_epoch, "Empty")
    node, address = coordinator_of(alive, prepared)
    [reloaded] = call(address, DESCRIBE_TRANSACTIONS, 0,
                      {"transactional_ids": [prepared]}).transaction_states
    assert (reloaded.producer_id, reloaded.producer_epoch) == (
        decided.producer_id, decided.producer_epoch)
    assert reloaded.transaction_state in ("PrepareCommit", "CompleteCommit")
    # The new coordinator sends the markers a dead one may have left unsent.
    wait_for(lambda: (s := describe(alive, prepared)).error_code == 0
             and s.transaction_state == "CompleteCommit", "the commit completed", timeout_s=60)
    successor = producer(cluster, "tx-moving", **{"bootstrap.servers": alive})
    successor.init_transactions(60)
    bumped = wait_for(lambda: (s := describe(alive, "tx-moving")).error_code == 0 and s,
                      "describe after the bump")
    assert bumped.producer_epoch == before.producer_epoch + 1
    successor.begin_transaction()
    successor.commit_transaction(30)


def prepare_commit(address: str, transactional_id: str) -> Any:
    """A transaction of ``transactional_id`` on ``orders``-0 left in PrepareCommit (raw
    InitProducerId, AddPartitionsToTxn, EndTxn commit); its state as described then."""
    init = wait_for(lambda: (a := call(address, INIT_PRODUCER_ID, 4, {
        "transactional_id": transactional_id, "transaction_timeout": 60_000,
        "producer_id": -1, "producer_epoch": -1})).error_code == 0 and a, "InitProducerId")
    added = call(address, ADD_PARTITIONS_TO_TXN, 3, {
        "v3_and_below_transactional_id": transactional_id,
        "v3_and_below_producer_id": init.producer_id,
        "v3_and_below_producer_epoch": init.producer_epoch,
        "v3_and_below_topics": [{"name": "orders", "partitions": [0]}]})
    assert added.results_by_topic_v3_and_below[0].results_by_partition[0].partition_error_code == 0
    end = call(address, END_TXN, 3, {"transactional_id": transactional_id,
                                     "producer_id": init.producer_id,
                                     "producer_epoch": init.producer_epoch, "committed": True})
    assert end.error_code == 0
    [state] = call(address, DESCRIBE_TRANSACTIONS, 0,
                   {"transactional_ids": [transactional_id]}).transaction_states
    assert state.transaction_state in ("PrepareCommit", "CompleteCommit")
    return state


def _is_node(c, address: str, node: int) -> bool:
    """Is ``address`` the Kafka listener of broker ``node``?"""
    return c.manifest()["processes"][f"broker-{node}"]["kafka"] == address


def test_kafka_python_producer_and_admin_client(cluster):
    """kafka-python (another lineage, older versions): its transactional producer and its
    admin client's DescribeTransactions and ListTransactions."""
    kafka = pytest.importorskip("kafka")
    producer = kafka.KafkaProducer(bootstrap_servers=cluster.kafka.split(","),
                                   transactional_id="tx-python")
    producer.init_transactions()
    producer.begin_transaction()
    producer.commit_transaction()
    admin = kafka.KafkaAdminClient(bootstrap_servers=cluster.kafka.split(","))
    try:
        described = admin.describe_transactions(["tx-python"])["tx-python"]
        assert (described.state, described.producer_epoch, described.topic_partitions) == (
            "Empty", 0, set())
        listed = admin.list_transactions(state_filters=["Empty"])  # every live broker asked
        found = [t for listings in listed.values() for t in listings
                 if t.transactional_id == "tx-python"]
        assert [(t.producer_id, t.state) for t in found] == [(described.producer_id, "Empty")]
    finally:
        admin.close()
        producer.close()


def test_aiokafka_transactional_producer(cluster):
    """aiokafka (asyncio, its own protocol versions): init, an empty transaction, and
    fencing by a second producer with the same transactional id."""
    aiokafka = pytest.importorskip("aiokafka")
    import asyncio

    async def run() -> None:
        loop = asyncio.get_running_loop()

        def quiet_fenced(loop: asyncio.AbstractEventLoop, context: dict) -> None:
            # aiokafka's sender task also ends with the fencing error, unretrieved.
            if not isinstance(context.get("exception"), aiokafka.errors.ProducerFenced):
                loop.default_exception_handler(context)
        loop.set_exception_handler(quiet_fenced)
        first = aiokafka.AIOKafkaProducer(bootstrap_servers=cluster.kafka,
                                          transactional_id="tx-aio")
        await first.start()
        try:
            async with first.transaction():
                pass
            second = aiokafka.AIOKafkaProducer(bootstrap_servers=cluster.kafka,
                                               transactional_id="tx-aio")
            await second.start()
            try:
                state = describe(cluster.kafka, "tx-aio")
                assert (state.transaction_state, state.producer_epoch) == ("Empty", 1)
                with pytest.raises(aiokafka.errors.ProducerFenced):
                    async with first.transaction():
                        await first.send_and_wait("orders", b"from the zombie")
            finally:
                await second.stop()
        finally:
            await first.stop()
    asyncio.run(run())
