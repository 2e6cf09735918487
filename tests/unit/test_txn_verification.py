"""KIP-890 part 1, the pure parts: the coordinator's verify_only answer, the leader's
verification entries (``VerificationCache``) and the produce errors they give."""

from __future__ import annotations

import pytest
from test_txn_state import Harness

from tidewater.broker.txn.verification import (
    VerificationCache,
    produce_error,
    transactional_producer,
)
from tidewater.proto import tidewater_pb2 as pb
from tidewater.proto.batch import TRANSACTIONAL_MASK
from tidewater.proto.control_records import encode_marker_batch
from tidewater.proto.records import encode_batch

pytestmark = pytest.mark.timeout(60)

T0, T1, OTHER = ("t", 0), ("t", 1), ("u", 0)


def _ongoing(h: Harness, *partitions: tuple[str, int]) -> tuple[int, int]:
    answer = h.init("tx")
    pid, epoch = answer.producer_id, answer.producer_epoch  # type: ignore[attr-defined]
    assert h.add("tx", pid, epoch, *partitions) == pb.NONE
    return pid, epoch


def _verify(h: Harness, pid: int, epoch: int, *partitions: tuple[str, int],
            txn: str = "tx") -> dict:
    return h.state.verify_partitions(transactional_id=txn, producer_id=pid,
                                     producer_epoch=epoch, partitions=list(partitions))


def test_the_coordinator_verifies_only_the_partitions_added_to_the_ongoing_transaction():
    h = Harness()
    pid, epoch = _ongoing(h, T0, T1)
    log_before = list(h.log)
    assert _verify(h, pid, epoch, T0, OTHER, T1) == {
        T0: pb.NONE, OTHER: pb.INVALID_TXN_STATE, T1: pb.NONE}
    assert h.log == log_before  # verify_only writes nothing


def test_after_the_transaction_ends_no_partition_is_in_it():
    h = Harness()
    pid, epoch = _ongoing(h, T0)
    assert h.end("tx", pid, epoch, committed=True) == pb.NONE
    # PrepareCommit: the markers are on their way.
    assert _verify(h, pid, epoch, T0) == {T0: pb.CONCURRENT_TRANSACTIONS}
    h.write_markers()
    assert _verify(h, pid, epoch, T0) == {T0: pb.INVALID_TXN_STATE}


def test_the_coordinator_refuses_other_producers_and_epochs():
    h = Harness()
    pid, epoch = _ongoing(h, T0)
    assert _verify(h, pid + 1, epoch, T0) == {T0: pb.INVALID_PRODUCER_ID_MAPPING}
    assert _verify(h, pid, epoch + 1, T0) == {T0: pb.PRODUCER_FENCED}
    assert _verify(h, pid, epoch, T0, txn="unknown") == {T0: pb.INVALID_PRODUCER_ID_MAPPING}


def test_an_entry_is_verified_by_its_answer_and_ended_by_a_marker():
    cache = VerificationCache(expiration_ms=1000)
    assert not cache.allows(T0, 7, 0, 3, 0)
    entry = cache.begin(T0, 7, 0, 3, 0)
    assert not cache.allows(T0, 7, 0, 3, 0)  # asked, not answered
    assert cache.on_answer(T0, 7, entry, pb.NONE)
    assert cache.allows(T0, 7, 0, 3, 10)
    assert not cache.allows(T1, 7, 0, 3, 10) and not cache.allows(T0, 8, 0, 3, 10)
    cache.on_marker(T0, 7)
    assert not cache.allows(T0, 7, 0, 3, 10)  # the next transaction asks again


def test_a_marker_between_the_question_and_the_answer_verifies_nothing():
    cache = VerificationCache(expiration_ms=1000)
    entry = cache.begin(T0, 7, 0, 3, 0)
    cache.on_marker(T0, 7)
    assert not cache.on_answer(T0, 7, entry, pb.NONE)
    assert not cache.allows(T0, 7, 0, 3, 0)
    # A newer question's answer is not taken by an older one's.
    newer = cache.begin(T0, 7, 0, 3, 1)
    assert newer is not entry and not cache.on_answer(T0, 7, entry, pb.NONE)
    assert cache.on_answer(T0, 7, newer, pb.NONE)


def test_a_refusal_drops_the_entry():
    cache = VerificationCache(expiration_ms=1000)
    entry = cache.begin(T0, 7, 0, 3, 0)
    assert not cache.on_answer(T0, 7, entry, pb.INVALID_TXN_STATE)
    assert len(cache) == 0


def test_another_producer_epoch_leader_epoch_or_age_is_not_verified():
    cache = VerificationCache(expiration_ms=1000)
    entry = cache.begin(T0, 7, 0, 3, 0)
    assert cache.on_answer(T0, 7, entry, pb.NONE)
    assert not cache.allows(T0, 7, 1, 3, 0)  # a bumped producer epoch
    assert not cache.allows(T0, 7, 0, 4, 0)  # led again since: markers may have come
    assert not cache.allows(T0, 7, 0, 3, 1000)  # expired
    assert cache.begin(T0, 7, 0, 4, 0) is not entry  # a new question for the new epoch
    assert cache.begin(T0, 7, 0, 4, 0) is cache.begin(T0, 7, 0, 4, 5)  # shared till answered


def test_the_cache_is_bounded_and_drops_the_oldest():
    cache = VerificationCache(expiration_ms=10_000, entries_max=2)
    first = cache.begin(T0, 1, 0, 0, 0)
    cache.begin(T0, 2, 0, 0, 1)
    cache.begin(T0, 3, 0, 0, 2)
    assert len(cache) == 2
    assert not cache.on_answer(T0, 1, first, pb.NONE)
    with pytest.raises(ValueError):
        VerificationCache(expiration_ms=0)


@pytest.mark.parametrize(("coordinator", "produce"), [
    (pb.INVALID_TXN_STATE, pb.INVALID_TXN_STATE),
    (pb.CLUSTER_AUTHORIZATION_FAILED, pb.INVALID_TXN_STATE),
    (pb.PRODUCER_FENCED, pb.INVALID_PRODUCER_EPOCH),
    (pb.NOT_COORDINATOR, pb.NOT_ENOUGH_REPLICAS),
    (pb.COORDINATOR_NOT_AVAILABLE, pb.NOT_ENOUGH_REPLICAS),
    (pb.COORDINATOR_LOAD_IN_PROGRESS, pb.NOT_ENOUGH_REPLICAS),
    (pb.CONCURRENT_TRANSACTIONS, pb.NOT_ENOUGH_REPLICAS),
    (pb.NETWORK_EXCEPTION, pb.NOT_ENOUGH_REPLICAS),
    (pb.INVALID_PRODUCER_ID_MAPPING, pb.INVALID_PRODUCER_ID_MAPPING),
])
def test_coordinator_codes_become_kafkas_produce_errors(coordinator, produce):
    error = produce_error(coordinator)
    assert error.error_code == produce
    assert error.retriable == (produce == pb.NOT_ENOUGH_REPLICAS)


def test_only_a_transactional_data_batch_needs_verification():
    plain = encode_batch([(None, b"v")], producer_id=5, producer_epoch=1, base_sequence=0)
    txn = encode_batch([(None, b"v")], producer_id=5, producer_epoch=1, base_sequence=1,
                       attributes=TRANSACTIONAL_MASK)
    marker = encode_marker_batch(5, 1, committed=True, coordinator_epoch=0, timestamp_ms=0)
    assert transactional_producer(plain) is None
    assert transactional_producer(marker) is None
    assert transactional_producer(txn) == (5, 1)
    assert transactional_producer(plain + txn) == (5, 1)  # a batch behind another counts


def test_the_switch_is_a_dynamic_broker_config_the_brokers_own_value_first():
    from tidewater.proto.broker_dynamic_config import TXN_VERIFICATION, dynamic_flag
    assert dynamic_flag({}, 1, TXN_VERIFICATION, True) is True
    assert dynamic_flag({"": {TXN_VERIFICATION: "false"}}, 1, TXN_VERIFICATION, True) is False
    both = {"": {TXN_VERIFICATION: "false"}, "1": {TXN_VERIFICATION: "TRUE"}}
    assert dynamic_flag(both, 1, TXN_VERIFICATION, False) is True
    assert dynamic_flag(both, 2, TXN_VERIFICATION, True) is False
