"""``__transaction_state`` records: Kafka's bytes, round trips, refusals."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tidewater.broker.txn import records
from tidewater.broker.txn.records import TxnLogRecord, TxnLogValue, TxnRecordError

pytestmark = pytest.mark.timeout(60)

VALUE = TxnLogValue(producer_id=7, producer_epoch=3, transaction_timeout_ms=60000, status=1,
                    partitions=(("t", (0, 2)),), last_update_timestamp_ms=1000,
                    start_timestamp_ms=900)


def test_key_and_value_bytes_are_kafkas_v0():
    record = TxnLogRecord("tx", VALUE)
    assert records.encode_key(record) == b"\x00\x00\x00\x02tx"
    assert records.encode_value(record) == (
        b"\x00\x00" + (7).to_bytes(8, "big") + b"\x00\x03" + (60000).to_bytes(4, "big")
        + b"\x01" + b"\x00\x00\x00\x01" + b"\x00\x01t" + b"\x00\x00\x00\x02"
        + b"\x00\x00\x00\x00" + b"\x00\x00\x00\x02" + (1000).to_bytes(8, "big")
        + (900).to_bytes(8, "big"))


def test_tombstone_round_trips():
    record = TxnLogRecord("tx", None)
    assert records.encode_value(record) is None
    assert records.decode(records.encode_key(record), None) == record


def test_v1_flexible_value_is_read_with_its_tags():
    raw = (b"\x00\x01" + (7).to_bytes(8, "big") + b"\x00\x03" + (60000).to_bytes(4, "big")
           + b"\x02" + b"\x02" + b"\x02t" + b"\x02" + b"\x00\x00\x00\x05" + b"\x00"
           + (1000).to_bytes(8, "big") + (900).to_bytes(8, "big")
           + b"\x02" + b"\x00\x08" + (5).to_bytes(8, "big") + b"\x02\x02\x00\x02")
    value = records.decode(b"\x00\x00\x00\x02tx", raw).value
    assert value == TxnLogValue(7, 3, 60000, 2, (("t", (5,)),), 1000, 900,
                                previous_producer_id=5)


@given(st.builds(
    TxnLogValue, producer_id=st.integers(-1, 2**63 - 1), producer_epoch=st.integers(-1, 32767),
    transaction_timeout_ms=st.integers(0, 2**31 - 1), status=st.integers(0, 7),
    partitions=st.lists(st.tuples(st.text(min_size=1, max_size=20), st.lists(
        st.integers(0, 2**31 - 1), max_size=5).map(tuple)), max_size=4).map(tuple),
    last_update_timestamp_ms=st.integers(-1, 2**62), start_timestamp_ms=st.integers(-1, 2**62)))
def test_every_value_round_trips(value):
    record = TxnLogRecord("id-é", value)
    assert records.decode(records.encode_key(record), records.encode_value(record)) == record


@given(st.data())
def test_a_cut_value_is_refused_not_misread(data):
    raw = records.encode_value(TxnLogRecord("tx", VALUE))
    assert raw is not None
    cut = data.draw(st.integers(0, len(raw) - 1))
    with pytest.raises(TxnRecordError):
        records.decode(b"\x00\x00\x00\x02tx", raw[:cut])


def test_unknown_versions_and_states_are_refused():
    with pytest.raises(TxnRecordError):
        records.decode(b"\x00\x01\x00\x02tx", None)
    raw = bytearray(records.encode_value(TxnLogRecord("tx", VALUE)) or b"")
    raw[16] = 9  # the status byte
    with pytest.raises(TxnRecordError):
        records.decode(b"\x00\x00\x00\x02tx", bytes(raw))
