"""The Kafka listener over real TCP with a real ReplicaManager: versions, order, hostile input.

Real clients (kcat, librdkafka, kafka-python, aiokafka) drive it in
tests/cli/test_kafka_clients.py; here raw frames test what no well-behaved
client sends: oversized and negative sizes, garbage, unknown keys and versions,
forged follower fetches, fetch sessions.
"""

from __future__ import annotations

import asyncio
import struct
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.unit.test_broker_fakes import make_batch
from tests.unit.test_broker_replica_manager import TP, lai, make_manager
from tidewater.broker.kafka import apis
from tidewater.broker.kafka.codec import decode_response, encode_request
from tidewater.broker.kafka.server import KafkaListener
from tidewater.broker.servicers.admin_forwarding import ControllerForwarder
from tidewater.proto import tidewater_pb2 as pb

pytestmark = pytest.mark.timeout(60)

MAX_REQUEST_BYTES = 64 * 1024


class Listening:
    def __init__(self, tmp_path):
        self.tmp_path = tmp_path
        self.security = None  # broker.security.BrokerSecurity (test_kafka_sasl.py)
        self.quotas = None  # kafka.connection_quotas.ConnectionQuotas (test_connection_quotas.py)

    async def prepare(self) -> None:
        """What a subclass adds to the replica manager before the listener starts."""

    async def __aenter__(self):
        self.rm, _ = make_manager(self.tmp_path)
        await self.rm.leader_and_isr(lai(leader=1, leader_epoch=0, isr=(1,), replicas=(1,)))
        await self.prepare()
        services = apis.Services(replica_manager=self.rm, metadata_cache=self.rm.metadata_cache,
                                 controller=ControllerForwarder(None), listener_name="KAFKA")
        self.listener = KafkaListener(services, host="127.0.0.1", port=0,
                                      max_request_bytes=MAX_REQUEST_BYTES,
                                      supervisor=self.rm.supervisor, security=self.security,
                                      quotas=self.quotas)
        self.port = await self.listener.start()
        return self

    async def __aexit__(self, *exc):
        self.rm.answer_long_polls()
        await self.listener.stop()
        await self.rm.stop()

    async def connect(self) -> Connection:
        reader, writer = await asyncio.open_connection("127.0.0.1", self.port)
        return Connection(reader, writer)


class Connection:
    def __init__(self, reader, writer):
        self.reader, self.writer = reader, writer

    async def send(self, api_key, version, correlation_id, values) -> None:
        self.writer.write(encode_request(api_key, version, correlation_id, values))
        await self.writer.drain()

    async def receive(self, api_key, version):
        size = struct.unpack(">i", await asyncio.wait_for(self.reader.readexactly(4), 10))[0]
        return decode_response(api_key, version, await self.reader.readexactly(size))

    async def call(self, api_key, version, values, correlation_id=7):
        await self.send(api_key, version, correlation_id, values)
        got_id, body = await self.receive(api_key, version)
        assert got_id == correlation_id
        return body

    async def closed_by_server(self) -> bool:
        return await asyncio.wait_for(self.reader.read(1), 10) == b""

    def close(self):
        self.writer.close()


API_VERSIONS_V3 = {"client_software_name": "test", "client_software_version": "1"}


async def api_versions_work(listening) -> None:
    c = await listening.connect()
    try:
        body = await c.call(apis.API_VERSIONS, 3, API_VERSIONS_V3)
        assert body.error_code == 0
    finally:
        c.close()


def produce_values(records: bytes, acks=1):
    return {"transactional_id": None, "acks": acks, "timeout": 5000, "topic_data": [
        {"name": TP.topic, "partition_data": [{"index": 0, "records": records}]}]}


def fetch_values(offset, *, replica_id=-1, session_id=0, session_epoch=-1, max_wait_ms=0):
    return {"replica_id": replica_id, "max_wait": max_wait_ms, "min_bytes": 1,
            "max_bytes": 1 << 20, "isolation_level": 0, "session_id": session_id,
            "session_epoch": session_epoch, "forgotten_topics_data": [], "rack_id": "",
            "topics": [{"topic": TP.topic, "partitions": [{
                "partition": 0, "current_leader_epoch": -1, "fetch_offset": offset,
                "last_fetched_epoch": -1, "log_start_offset": -1,
                "partition_max_bytes": 1 << 20}]}]}


async def test_api_versions_lists_exactly_what_is_served(tmp_path):
    async with Listening(tmp_path) as listening:
        c = await listening.connect()
        for version in range(0, 5):
            body = await c.call(apis.API_VERSIONS, version,
                                API_VERSIONS_V3 if version >= 3 else {})
            assert body.error_code == 0
            assert {k.api_key: (k.min_version, k.max_version) for k in body.api_keys} == \
                apis.SUPPORTED
        c.close()


async def test_an_unknown_api_versions_version_gets_a_v0_answer_with_our_versions(tmp_path):
    # KIP-511: a newer client sends its newest ApiVersions; it must be able to read ours.
    async with Listening(tmp_path) as listening:
        c = await listening.connect()
        frame = bytearray(encode_request(apis.API_VERSIONS, 3, 11, API_VERSIONS_V3))
        struct.pack_into(">h", frame, 6, 9)  # claim ApiVersions v9
        c.writer.write(bytes(frame))
        correlation_id, body = await c.receive(apis.API_VERSIONS, 0)
        assert correlation_id == 11 and body.error_code == pb.UNSUPPORTED_VERSION
        assert {k.api_key for k in body.api_keys} == set(apis.SUPPORTED)
        # The connection goes on.
        assert (await c.call(apis.API_VERSIONS, 3, API_VERSIONS_V3)).error_code == 0
        c.close()


async def test_a_frame_above_the_limit_is_refused_before_it_is_read(tmp_path):
    async with Listening(tmp_path) as listening:
        big = await listening.connect()
        # Only the size prefix is sent: the server must not wait for (or buffer) the body.
        big.writer.write(struct.pack(">i", MAX_REQUEST_BYTES + 1))
        await big.writer.drain()
        assert await big.closed_by_server()
        negative = await listening.connect()
        negative.writer.write(struct.pack(">i", -5))
        assert await negative.closed_by_server()
        await api_versions_work(listening)


@pytest.mark.parametrize("frame", [
    b"\x00",  # no header
    struct.pack(">hhi", 71, 0, 1) + b"\x00\x00",  # an API we do not serve (telemetry)
    struct.pack(">hhi", apis.PRODUCE, 2, 1) + b"\x00\x00",  # message format v0/v1
    struct.pack(">hhi", apis.METADATA, 99, 1),  # a version nobody has
    struct.pack(">hhi", apis.METADATA, 12, 1) + b"\xff" * 40,  # garbage body
    # Found by make fuzz: a Fetch v4 whose topic array is null (-1), which no field allows.
    (Path(__file__).parents[1] / "fuzz/corpus/kafka_request/crash-fetch-v4-null-topics"
     ).read_bytes(),
])
async def test_garbage_closes_that_connection_only(tmp_path, frame):
    async with Listening(tmp_path) as listening:
        other = await listening.connect()
        bad = await listening.connect()
        bad.writer.write(struct.pack(">i", len(frame)) + frame)
        assert await bad.closed_by_server()
        assert (await other.call(apis.API_VERSIONS, 3, API_VERSIONS_V3)).error_code == 0
        other.close()


@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.binary(max_size=300))
def test_random_frames_never_break_the_listener(tmp_path_factory, junk):
    async def run():
        async with Listening(tmp_path_factory.mktemp("junk")) as listening:
            c = await listening.connect()
            c.writer.write(struct.pack(">i", len(junk)) + junk)
            c.writer.write_eof()
            await asyncio.wait_for(c.reader.read(), 10)  # whatever it answers, then closed
            await api_versions_work(listening)
    asyncio.run(run())


async def test_produce_then_fetch_pass_record_batches_through_untouched(tmp_path):
    async with Listening(tmp_path) as listening:
        c = await listening.connect()
        batch = make_batch(3)
        produced = await c.call(apis.PRODUCE, 9, produce_values(batch))
        [[partition]] = [t.partition_responses for t in produced.responses]
        assert partition.error_code == 0 and partition.base_offset == 0
        fetched = await c.call(apis.FETCH, 12, fetch_values(0))
        [[data]] = [t.partitions for t in fetched.responses]
        assert data.error_code == 0 and data.high_watermark == 3
        # Base offset and partition leader epoch are the broker's; the rest is the client's.
        assert bytes(data.records)[16:] == batch[16:]
        listed = await c.call(apis.LIST_OFFSETS, 6, {"replica_id": -1, "isolation_level": 0,
                                                     "topics": [{"name": TP.topic, "partitions": [
                                                         {"partition_index": 0,
                                                          "current_leader_epoch": -1,
                                                          "timestamp": -1}]}]})
        assert listed.topics[0].partitions[0].offset == 3
        c.close()


async def test_a_produce_larger_than_the_read_buffer_is_appended_whole(tmp_path):
    """Frames past the 64 KiB scratch buffer are read into their own buffer (framing.py);
    kio takes them read-only, and the batch reaches the log byte for byte."""
    async with Listening(tmp_path) as listening:
        listening.listener.max_request_bytes = 1024 * 1024
        c = await listening.connect()
        batches = [make_batch(n, bytes(range(256)) * 2) for n in (600, 1, 300)]  # 300, 0.5, 150 KiB
        for expected_offset, batch in zip((0, 600, 601), batches, strict=True):
            produced = await c.call(apis.PRODUCE, 9, produce_values(batch))
            [[partition]] = [t.partition_responses for t in produced.responses]
            assert partition.error_code == 0 and partition.base_offset == expected_offset
        fetched = await c.call(apis.FETCH, 12, fetch_values(0))
        [[data]] = [t.partitions for t in fetched.responses]
        records = bytes(data.records)
        position = 0
        for batch in batches:  # base offset and leader epoch are the broker's
            assert records[position + 16:position + len(batch)] == batch[16:]
            position += len(batch)
        assert position == len(records)
        c.close()


async def test_answers_keep_request_order_behind_a_long_poll(tmp_path):
    async with Listening(tmp_path) as listening:
        c = await listening.connect()
        await c.send(apis.FETCH, 12, 1, fetch_values(0, max_wait_ms=300))  # empty log: waits
        await c.send(apis.API_VERSIONS, 3, 2, API_VERSIONS_V3)
        first_id, fetched = await c.receive(apis.FETCH, 12)
        second_id, _ = await c.receive(apis.API_VERSIONS, 3)
        assert (first_id, second_id) == (1, 2)
        assert fetched.responses[0].partitions[0].high_watermark == 0
        c.close()


async def test_acks_zero_is_never_answered(tmp_path):
    async with Listening(tmp_path) as listening:
        c = await listening.connect()
        await c.send(apis.PRODUCE, 9, 1, produce_values(make_batch(1), acks=0))
        await c.send(apis.API_VERSIONS, 3, 2, API_VERSIONS_V3)
        correlation_id, _ = await c.receive(apis.API_VERSIONS, 3)
        assert correlation_id == 2
        assert listening.rm.partitions[TP].high_watermark == 1
        c.close()


async def test_forged_follower_fetches_and_unknown_sessions_are_refused(tmp_path):
    async with Listening(tmp_path) as listening:
        c = await listening.connect()
        forged = await c.call(apis.FETCH, 12, fetch_values(0, replica_id=2))
        assert forged.error_code == pb.CLUSTER_AUTHORIZATION_FAILED and not forged.responses
        # An incremental fetch (epoch > 0) in a session this broker never opened.
        session = await c.call(apis.FETCH, 12, fetch_values(0, session_id=5, session_epoch=1))
        assert session.error_code == pb.FETCH_SESSION_ID_NOT_FOUND and not session.responses
        c.close()


def zstd_batch() -> bytes:
    from tidewater.proto.compression import COMPRESSION_ZSTD
    from tidewater.proto.records import encode_batch
    return encode_batch([(b"k", b"v" * 100)] * 3, compression=COMPRESSION_ZSTD)


async def test_zstd_needs_produce_v7_and_fetch_v10(tmp_path):
    # KIP-110: a client too old to ask for zstd could not decompress it either.
    async with Listening(tmp_path) as listening:
        c = await listening.connect()
        old = await c.call(apis.PRODUCE, 6, produce_values(zstd_batch()))
        assert old.responses[0].partition_responses[0].error_code == \
            pb.UNSUPPORTED_COMPRESSION_TYPE
        assert listening.rm.partitions[TP].log.log_end_offset == 0  # nothing appended
        new = await c.call(apis.PRODUCE, 7, produce_values(zstd_batch()))
        assert new.responses[0].partition_responses[0].error_code == 0
        old_fetch = await c.call(apis.FETCH, 9, fetch_values(0))
        [[data]] = [t.partitions for t in old_fetch.responses]
        assert data.error_code == pb.UNSUPPORTED_COMPRESSION_TYPE and not data.records
        new_fetch = await c.call(apis.FETCH, 10, fetch_values(0))
        [[data]] = [t.partitions for t in new_fetch.responses]
        assert data.error_code == 0 and data.records
        c.close()


async def test_a_batch_larger_than_max_bytes_is_still_returned_whole(tmp_path):
    # KIP-74: otherwise a consumer whose limit is below one batch never progresses.
    async with Listening(tmp_path) as listening:
        c = await listening.connect()
        batch = make_batch(50, payload=b"y" * 20)
        await c.call(apis.PRODUCE, 9, produce_values(batch))
        tiny = fetch_values(0)
        tiny["max_bytes"] = 10
        tiny["topics"][0]["partitions"][0]["partition_max_bytes"] = 10
        fetched = await c.call(apis.FETCH, 12, tiny)
        [[data]] = [t.partitions for t in fetched.responses]
        assert data.error_code == 0 and len(data.records) == len(batch)
        c.close()


async def test_fetch_checks_the_consumers_leader_epoch(tmp_path):
    # KIP-320: a consumer that knows a newer epoch, or an older one, is told so.
    async with Listening(tmp_path) as listening:
        await listening.rm.leader_and_isr(lai(leader=1, leader_epoch=3, partition_epoch=1,
                                              isr=(1,), replicas=(1,)))
        c = await listening.connect()
        for epoch, code in ((3, 0), (5, pb.UNKNOWN_LEADER_EPOCH), (1, pb.FENCED_LEADER_EPOCH)):
            request = fetch_values(0)
            request["topics"][0]["partitions"][0]["current_leader_epoch"] = epoch
            fetched = await c.call(apis.FETCH, 12, request)
            assert fetched.responses[0].partitions[0].error_code == code, epoch
        c.close()


@pytest.mark.parametrize("version", range(0, 13))
async def test_metadata_every_version_names_the_kafka_listener_and_the_topic(tmp_path, version):
    from tests.unit.test_broker_replica_manager import CLUSTER_ID, TOPIC_ID

    async with Listening(tmp_path) as listening:
        await listening.rm.update_metadata(pb.UpdateMetadataRequest(
            controller_id=3000, controller_epoch=1, cluster_id=CLUSTER_ID, brokers=[
                pb.BrokerRegistration(broker_id=1, broker_epoch=7, listeners=[
                    pb.Listener(name="INTERNAL", host="10.0.0.1", port=1),
                    pb.Listener(name="KAFKA", host="127.0.0.1", port=listening.port)])],
            partitions=[pb.PartitionState(topic=TP.topic, partition=0, leader=1, leader_epoch=0,
                                          replicas=[1], isr=[1], topic_id=TOPIC_ID)],
            topics=[pb.TopicConfig(name=TP.topic)]))
        c = await listening.connect()
        request = {"topics": None if version >= 1 else [], "allow_auto_topic_creation": False,
                   "include_topic_authorized_operations": False,
                   "include_cluster_authorized_operations": False}
        body = await c.call(apis.METADATA, version, request)
        assert [(b.node_id, b.host, b.port) for b in body.brokers] == \
            [(1, "127.0.0.1", listening.port)]
        [topic] = body.topics
        assert topic.name == TP.topic and topic.error_code == 0
        assert [(p.partition_index, p.leader_id) for p in topic.partitions] == [(0, 1)]
        if version >= 10:
            assert topic.topic_id.bytes == TOPIC_ID
        if version >= 1:
            assert body.controller_id == 1  # this broker: it forwards admin requests
            none = await c.call(apis.METADATA, version, {**request, "topics": []})
            assert none.topics == ()  # v1+: an empty list asks for no topic
        c.close()


def _listed(listening, *broker_ids, fenced=()):
    """An UpdateMetadata listing ``broker_ids`` (all on this listener's port)."""
    listeners = [pb.Listener(name="KAFKA", host="127.0.0.1", port=listening.port)]
    return pb.UpdateMetadataRequest(controller_id=3000, controller_epoch=1, brokers=[
        pb.BrokerRegistration(broker_id=b, broker_epoch=7, listeners=listeners,
                              fenced=b in fenced) for b in broker_ids])


@pytest.mark.parametrize("fenced, named", [((), 1), ((1,), 2)], ids=["listed", "self-fenced"])
async def test_metadata_names_a_controller_it_lists(tmp_path, fenced, named):
    """Admin requests go to the controller a Metadata answer names; this broker (it
    forwards them) only when its answer lists it. A broker whose cache has itself fenced
    (just registered: the UpdateMetadata unfencing it is still on its way) names a
    listed one, as a KRaft broker names a live broker of its cache."""
    async with Listening(tmp_path) as listening:
        await listening.rm.update_metadata(_listed(listening, 1, 2, fenced=fenced))
        c = await listening.connect()
        try:
            body = await c.call(apis.METADATA, 12, {
                "topics": [], "allow_auto_topic_creation": False,
                "include_topic_authorized_operations": False})
            assert body.controller_id == named
            assert named in [b.node_id for b in body.brokers]
            cluster = await c.call(apis.DESCRIBE_CLUSTER, 0, {
                "include_cluster_authorized_operations": False})
            assert cluster.controller_id == named
        finally:
            c.close()


async def test_metadata_listing_no_broker_names_no_controller(tmp_path):
    # -1 (Kafka's NO_CONTROLLER_ID): librdkafka asks for metadata again, while an id it
    # cannot find among the brokers leaves it waiting for that broker.
    async with Listening(tmp_path) as listening:
        await listening.rm.update_metadata(_listed(listening, 1, fenced=(1,)))
        c = await listening.connect()
        try:
            body = await c.call(apis.METADATA, 12, {
                "topics": [], "allow_auto_topic_creation": False,
                "include_topic_authorized_operations": False})
            assert (body.controller_id, body.brokers) == (-1, ())
        finally:
            c.close()


class _CreatingController:
    """The forwarder's place: takes every CreateTopics."""

    def __init__(self):
        self.created: list[str] = []

    async def CreateTopics(self, request, context):
        self.created += [t.name for t in request.topics]
        return pb.CreateTopicsResponse(topics=[pb.TopicResult(name=t.name)
                                               for t in request.topics])


async def test_librdkafka_creates_a_topic_through_a_broker_not_yet_unfenced_in_its_cache(
        tmp_path):
    """The landing-CI hang: a broker registered a moment ago has itself fenced in its
    cache. It named itself controller while not listing itself, so librdkafka never
    found that controller: create_topics sent nothing and timed out."""
    admin = pytest.importorskip("confluent_kafka.admin")
    import dataclasses

    async with Listening(tmp_path) as listening:
        controller = _CreatingController()
        listening.listener.services = dataclasses.replace(listening.listener.services,
                                                          controller=controller)
        await listening.rm.update_metadata(_listed(listening, 1, 2, fenced=(1,)))
        client = admin.AdminClient({"bootstrap.servers": f"127.0.0.1:{listening.port}",
                                    "log_level": 0})
        [future] = client.create_topics([admin.NewTopic("created", 1, 1)],
                                        request_timeout=20).values()
        # Waited for in a thread: the listener serves on this loop meanwhile.
        await asyncio.get_running_loop().run_in_executor(None, future.result, 30)
        assert controller.created == ["created"]


@pytest.mark.parametrize("seed", sorted(
    (Path(__file__).parents[1] / "fuzz/corpus/kafka_request").glob("seed-*")),
    ids=lambda p: p.name)
def test_the_length_walk_ends_where_kio_does_on_valid_requests(seed):
    # check_lengths runs before kio's reader on every request: it must accept exactly the
    # frames kio reads, or real clients would be refused.
    from tidewater.broker.kafka.codec import _reader, check_lengths, peek_head, request_type

    frame = seed.read_bytes()
    api_key, api_version, _ = peek_head(frame)
    entity_type = request_type(api_key, api_version)
    end = check_lengths(entity_type.__header_schema__, frame, 0)
    _, header_used = _reader(entity_type.__header_schema__)(frame, 0)
    assert end == header_used
    _, body_used = _reader(entity_type)(frame, end)
    assert check_lengths(entity_type, frame, end) == end + body_used == len(frame)


async def test_a_length_beyond_the_frame_is_refused_before_kio_allocates_it(tmp_path):
    # Found by make fuzz: kio's native reader allocated a 200 GB array for a 100-byte frame
    # and the process aborted. Now the frame is refused and the broker lives on.
    frame = (Path(__file__).parents[1] / "fuzz/corpus/kafka_request/crash-fetch-v12-200gb-array"
             ).read_bytes()
    async with Listening(tmp_path) as listening:
        bad = await listening.connect()
        bad.writer.write(struct.pack(">i", len(frame)) + frame)
        assert await bad.closed_by_server()
        await api_versions_work(listening)


async def test_a_transactional_produce_is_taken_but_zstd_is_still_refused_below_v7(tmp_path):
    # Transactions (issue 27): a transactional id no longer refuses the request; the
    # version rules stay (zstd needs Produce v7+).
    async with Listening(tmp_path) as listening:
        c = await listening.connect()
        values = produce_values(zstd_batch())
        values["transactional_id"] = "tx-1"
        answer = await c.call(apis.PRODUCE, 6, values)
        [[partition]] = [t.partition_responses for t in answer.responses]
        assert partition.error_code == pb.UNSUPPORTED_COMPRESSION_TYPE
        assert listening.rm.partitions[TP].log.log_end_offset == 0
        c.close()


@pytest.mark.parametrize("records_bytes", [0, 100, 4095, 4096, 300_000])
def test_a_response_in_parts_is_the_same_frame_with_the_records_not_copied(records_bytes):
    from tidewater.broker.kafka.codec import (
        RequestHead,
        build,
        encode_response_parts,
        response_type,
    )
    from tidewater.broker.serving.fetch import FetchedPartition

    records = bytes(range(256)) * (records_bytes // 256) + b"x" * (records_bytes % 256)
    results = [FetchedPartition("t", 0, pb.NONE, "", 7, 0, 9, 3, records, None),
               FetchedPartition("t", 1, pb.NONE, "", 7, 0, 9, 3, b"", (2, 5))]
    for version in (4, 11, 12):
        head = RequestHead(apis.FETCH, version, 42, "c")
        body = build(response_type(apis.FETCH, version), apis.fetch_values(results, version))
        parts = encode_response_parts(head, body)
        frame = b"".join(parts)
        assert struct.unpack(">i", frame[:4])[0] == len(frame) - 4
        correlation_id, decoded = decode_response(apis.FETCH, version, frame[4:])
        got = decoded.responses[0].partitions[0]
        assert correlation_id == 42
        assert (got.records or b"") == records and got.high_watermark == 7
        if records_bytes >= 4096:  # the records reach the transport as they are
            assert any(part is records for part in parts)


async def test_a_client_that_half_closes_still_gets_its_answer(tmp_path):
    async with Listening(tmp_path) as listening:
        c = await listening.connect()
        await c.send(apis.API_VERSIONS, 3, 7, API_VERSIONS_V3)
        c.writer.write_eof()  # done sending, as `printf ... | nc` is
        got_id, body = await c.receive(apis.API_VERSIONS, 3)
        assert got_id == 7 and body.error_code == 0
        assert await c.closed_by_server()
