"""Issue 27, the log side of transactions: producer state, markers, the last stable
offset and the aborted-transaction index (``.txnindex``), including recovery."""

from __future__ import annotations

import os

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tidewater.broker.storage.log import Log
from tidewater.broker.storage.log_config import LogConfig
from tidewater.broker.storage.producer_state import ProducerStateManager
from tidewater.broker.storage.topics import TopicPartition
from tidewater.broker.storage.txn_index import (
    ENTRY_SIZE,
    AbortedTxn,
    decode_entries,
    encode_entry,
    txn_index_path,
)
from tidewater.proto.batch import TRANSACTIONAL_MASK, iter_batches
from tidewater.proto.control_records import encode_marker_batch, marker_of_batch, parse_marker
from tidewater.proto.errors import (
    InvalidProducerEpochError,
    InvalidRecordError,
    InvalidTxnStateError,
    TransactionCoordinatorFencedError,
)
from tidewater.proto.records import encode_batch

pytestmark = pytest.mark.timeout(120)


def txn_batch(pid: int, seq: int, n: int = 1, epoch: int = 0) -> bytes:
    return encode_batch([(None, b"t%d" % i) for i in range(n)], producer_id=pid,
                        producer_epoch=epoch, base_sequence=seq, attributes=TRANSACTIONAL_MASK,
                        base_timestamp_ms=1000)


def plain_batch(n: int = 1, pid: int = -1, seq: int = -1) -> bytes:
    return encode_batch([(None, b"p")] * n, producer_id=pid, producer_epoch=0 if pid >= 0 else -1,
                        base_sequence=seq, base_timestamp_ms=1000)


def marker(pid: int, committed: bool, coordinator_epoch: int = 0, epoch: int = 0) -> bytes:
    return encode_marker_batch(pid, epoch, committed=committed,
                               coordinator_epoch=coordinator_epoch, timestamp_ms=1000)


def open_log(tmp_path, **config) -> Log:
    return Log.open(tmp_path / "t-0", LogConfig(**config), now_ms=0)


# -- control records ---------------------------------------------------------------

def test_a_marker_batch_has_kafkas_layout():
    data = marker(7, True, coordinator_epoch=3, epoch=2)
    [(position, header)] = list(iter_batches(data))
    assert header.attributes & 0x30 == 0x30  # control and transactional
    assert (header.producer_id, header.producer_epoch, header.base_sequence) == (7, 2, -1)
    assert marker_of_batch(data, position, header) == (True, 3)
    assert parse_marker(b"\x00\x00\x00\x00", b"\x00\x00\x00\x00\x00\x05") == (False, 5)
    assert parse_marker(b"\x00\x00\x00\x05", None) is None  # another control type


# -- producer state ----------------------------------------------------------------

def test_producer_state_tracks_open_transactions_and_the_first_unstable_offset():
    state = ProducerStateManager()
    state.on_batch(1, 0, 0, 10, 12, 1000, is_transactional=True)
    state.on_batch(2, 0, 0, 13, 13, 1000, is_transactional=True)
    state.on_batch(1, 0, 3, 14, 14, 1000, is_transactional=True)  # same transaction
    assert state.first_unstable_offset == 10
    assert state.ongoing_transactions() == {1: 10, 2: 13}
    done = state.on_marker(1, 0, 15, 1000, committed=False, coordinator_epoch=0)
    assert done is not None and (done.first_offset, done.last_offset, done.is_aborted) == (
        10, 15, True)
    assert state.last_stable_offset_after(done) == 13  # producer 2 still holds it back
    assert state.first_unstable_offset == 13
    done = state.on_marker(2, 0, 16, 1000, committed=True, coordinator_epoch=0)
    assert done is not None and not done.is_aborted
    assert state.last_stable_offset_after(done) == 17
    assert state.first_unstable_offset is None
    # A retried marker ends nothing.
    assert state.on_marker(2, 0, 17, 1000, committed=True, coordinator_epoch=0) is None


def test_leader_checks_of_transactions():
    state = ProducerStateManager()
    state.on_batch(1, 0, 0, 0, 0, 1000, is_transactional=True)
    with pytest.raises(InvalidTxnStateError):
        state.check_leader_append([(1, 0, 1, 0, False)])
    assert state.check_leader_append([(1, 0, 1, 0, True)]) is None
    state.on_marker(1, 0, 1, 1000, committed=True, coordinator_epoch=5)
    with pytest.raises(TransactionCoordinatorFencedError):
        state.check_marker(1, 0, 4)
    state.on_batch(1, 1, 0, 2, 2, 1000, is_transactional=True)
    with pytest.raises(InvalidProducerEpochError):
        state.check_marker(1, 0, 5)
    state.check_marker(1, 1, 5)
    state.check_marker(99, 0, 0)  # unknown producer: written (a retried marker)


def test_snapshots_keep_open_transactions_and_coordinator_epochs():
    state = ProducerStateManager()
    state.on_batch(1, 0, 0, 10, 12, 1000, is_transactional=True)
    state.on_batch(2, 0, 0, 13, 13, 1000)
    state.on_marker(3, 4, 14, 1000, committed=True, coordinator_epoch=9)
    copy = ProducerStateManager()
    copy.load_snapshot(state.snapshot_bytes(), 15)
    assert copy.ongoing_transactions() == {1: 10}
    assert copy.entries[3].coordinator_epoch == 9
    assert copy.first_unstable_offset == 10


def test_a_producer_with_an_open_transaction_does_not_expire():
    state = ProducerStateManager(expiration_ms=10)
    state.on_batch(1, 0, 0, 0, 0, 1000, is_transactional=True)
    state.on_batch(2, 0, 0, 1, 1, 1000)
    assert state.remove_expired(5000) == [2]
    assert state.first_unstable_offset == 0


# -- the index file ------------------------------------------------------------------

@given(st.lists(st.tuples(st.integers(0, 2**62), st.integers(0, 2**62), st.integers(0, 2**62),
                          st.integers(0, 2**62)), max_size=20),
       st.integers(0, ENTRY_SIZE - 1))
def test_index_entries_round_trip_and_a_torn_tail_is_dropped(fields, torn):
    entries = [AbortedTxn(*f) for f in fields]
    data = b"".join(map(encode_entry, entries))
    assert len(data) == ENTRY_SIZE * len(entries)
    extra = encode_entry(AbortedTxn(1, 2, 3, 4))[:torn]
    assert decode_entries(data + extra) == (entries, len(data))


def test_index_entry_layout_is_kafkas():
    raw = encode_entry(AbortedTxn(5, 10, 20, 21))
    assert raw == (b"\x00\x00" + (5).to_bytes(8, "big") + (10).to_bytes(8, "big")
                   + (20).to_bytes(8, "big") + (21).to_bytes(8, "big"))


# -- the log -------------------------------------------------------------------------

def test_log_tracks_transactions_and_writes_aborts_to_the_txnindex(tmp_path):
    log = open_log(tmp_path)
    log.append_as_leader(txn_batch(1, 0, 3), 0, 1000)            # 0-2
    log.append_as_leader(txn_batch(2, 0), 0, 1000)               # 3
    assert log.first_unstable_offset == 0
    log.append_as_leader(marker(1, False), 0, 1000, markers_allowed=True)  # 4: abort
    assert log.first_unstable_offset == 3
    log.append_as_leader(marker(2, True), 0, 1000, markers_allowed=True)   # 5: commit
    assert log.first_unstable_offset is None
    assert log.aborted_transactions(0, 10) == [AbortedTxn(1, 0, 4, 3)]
    assert log.aborted_transactions(5, 10) == []
    path = txn_index_path(log.dir, 0)
    assert decode_entries(path.read_bytes()) == ([AbortedTxn(1, 0, 4, 3)], ENTRY_SIZE)
    log.close()
    reopened = open_log(tmp_path)
    assert reopened.aborted_transactions(0, 10) == [AbortedTxn(1, 0, 4, 3)]
    assert reopened.first_unstable_offset is None
    reopened.close()


def test_clients_cannot_produce_control_batches(tmp_path):
    log = open_log(tmp_path)
    with pytest.raises(InvalidRecordError):
        log.append_as_leader(marker(1, True), 0, 1000)
    with pytest.raises(InvalidRecordError):  # transactional without a producer id
        log.append_as_leader(encode_batch([(None, b"x")], attributes=TRANSACTIONAL_MASK), 0, 0)
    assert log.log_end_offset == 0
    log.close()


def test_a_stale_coordinator_cannot_write_a_marker(tmp_path):
    log = open_log(tmp_path)
    log.append_as_leader(txn_batch(1, 0), 0, 1000)
    log.append_as_leader(marker(1, True, coordinator_epoch=3), 0, 1000, markers_allowed=True)
    with pytest.raises(TransactionCoordinatorFencedError):
        log.append_as_leader(marker(1, False, coordinator_epoch=2), 0, 1000,
                             markers_allowed=True)
    assert log.log_end_offset == 2
    log.close()


def test_a_follower_builds_the_same_transactions_and_index(tmp_path):
    leader = Log.open(tmp_path / "a-0", LogConfig(), now_ms=0)
    follower = Log.open(tmp_path / "b-0", LogConfig(), now_ms=0)
    leader.append_as_leader(txn_batch(1, 0, 2), 0, 1000)
    leader.append_as_leader(txn_batch(2, 0), 0, 1000)
    leader.append_as_leader(marker(1, False), 0, 1000, markers_allowed=True)
    follower.append_as_follower(leader.read(0, 1 << 20).records, 1000)
    assert follower.first_unstable_offset == leader.first_unstable_offset == 2
    assert follower.aborted_transactions(0, 100) == leader.aborted_transactions(0, 100)
    assert follower.producer_state.ongoing_transactions() == {2: 2}
    leader.close()
    follower.close()


def test_truncation_drops_the_index_entries_of_cut_markers_and_reopens_transactions(tmp_path):
    log = open_log(tmp_path)
    log.append_as_leader(txn_batch(1, 0), 0, 1000)                          # 0
    log.append_as_leader(marker(1, False), 0, 1000, markers_allowed=True)   # 1
    assert log.aborted_transactions(0, 10) == [AbortedTxn(1, 0, 1, 2)]
    log.truncate_to(1)
    assert log.aborted_transactions(0, 10) == []
    assert log.first_unstable_offset == 0  # the transaction is open again
    assert not txn_index_path(log.dir, 0).exists()
    log.close()


def test_retention_deletes_the_txnindex_with_its_segment(tmp_path):
    log = open_log(tmp_path, segment_bytes=300)
    log.append_as_leader(txn_batch(1, 0), 0, 1000)
    log.append_as_leader(marker(1, False), 0, 1000, markers_allowed=True)
    while len(log.segments()) < 3:
        log.append_as_leader(plain_batch(), 0, 1000)
    first = txn_index_path(log.dir, 0)
    assert first.exists()
    log.maybe_increment_log_start_offset(log.segments()[1].base_offset)
    log.delete_old_segments(10**13, log.log_end_offset)
    assert log.segments()[0].base_offset > 0
    assert not first.exists()  # renamed .deleted with its segment, unlinked in the background
    assert log.aborted_transactions(0, 100) == []
    log.close()


# One operation of a generated history: (kind, producer).
_ops = st.lists(st.tuples(st.sampled_from(["txn", "plain", "commit", "abort", "roll"]),
                          st.integers(0, 2)), min_size=1, max_size=25)


def _model(log_batches: list[tuple[int, int, int, bool, bool | None]]
           ) -> tuple[dict[int, int], list[AbortedTxn]]:
    """Open transactions and aborted ones from the batches alone: (base offset, last
    offset, producer, transactional, committed-or-None for data)."""
    ongoing: dict[int, int] = {}
    aborted: list[AbortedTxn] = []
    for base, _last, pid, transactional, committed in log_batches:
        if committed is None:
            if transactional and pid not in ongoing:
                ongoing[pid] = base
            continue
        first = ongoing.pop(pid, None)
        if first is not None and not committed:
            lso = min(ongoing.values(), default=base + 1)
            aborted.append(AbortedTxn(pid, first, base, lso))
    return ongoing, aborted


def _history(log: Log) -> list[tuple[int, int, int, bool, bool | None]]:
    out = []
    offset = log.log_start_offset
    while offset < log.log_end_offset:  # a read returns one segment's batches
        result = log.read(offset, 1 << 30)
        data = result.records
        for position, header in iter_batches(data):
            m = marker_of_batch(data, position, header) if header.is_control else None
            out.append((header.base_offset, header.last_offset, header.producer_id,
                        bool(header.attributes & TRANSACTIONAL_MASK),
                        None if m is None else m.committed))
        offset = result.next_offset
    return out


@settings(max_examples=40, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=_ops, cut=st.floats(0, 1), torn_snapshot=st.booleans())
def test_recovery_from_a_cut_log_rebuilds_transactions_and_the_index(tmp_path_factory, ops,
                                                                        cut, torn_snapshot):
    tmp_path = tmp_path_factory.mktemp("txn")
    log = open_log(tmp_path, segment_bytes=400)
    sequences = {0: 0, 1: 0, 2: 0}
    open_txn: set[int] = set()
    for kind, pid in ops:
        if kind == "txn":
            log.append_as_leader(txn_batch(10 + pid, sequences[pid]), 0, 1000)
            sequences[pid] += 1
            open_txn.add(pid)
        elif kind == "plain" and pid not in open_txn:
            log.append_as_leader(plain_batch(), 0, 1000)
        elif kind in ("commit", "abort"):
            log.append_as_leader(marker(10 + pid, kind == "commit"), 0, 1000,
                                 markers_allowed=True)
            open_txn.discard(pid)
        elif kind == "roll":
            log.roll(1000)
    # Before any cut, the state agrees with the model of its own batches.
    ongoing, aborted = _model(_history(log))
    assert log.producer_state.ongoing_transactions() == ongoing
    assert log.aborted_transactions(0, 1 << 40) == aborted
    last = log.segments()[-1]
    log.close()
    size = os.path.getsize(last.log_path)
    os.truncate(last.log_path, int(size * cut))
    directory = tmp_path / "t-0"
    snapshots = sorted(n for n in os.listdir(directory) if n.endswith(".snapshot"))
    if torn_snapshot and len(snapshots) >= 2:
        # A crash tore the newest snapshot: an older one and the batches after it serve.
        newest = directory / snapshots[-1]
        os.truncate(newest, os.path.getsize(newest) // 2)
    reopened = Log.open(directory, LogConfig(segment_bytes=400), now_ms=0)
    ongoing, aborted = _model(_history(reopened))
    assert reopened.producer_state.ongoing_transactions() == ongoing
    assert reopened.aborted_transactions(0, 1 << 40) == aborted
    reopened.close()


# -- tide dump-log -------------------------------------------------------------------

def test_dump_log_shows_markers_and_decodes_the_txnindex(tmp_path):
    import contextlib
    import io
    import json

    from tidewater.tools.cli import main as tide_main

    def dump(*args: str) -> tuple[int, list[dict]]:
        out = io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
            code = tide_main(["dump-log", *args, "--json", "--verify"])
        return code, [json.loads(line) for line in out.getvalue().splitlines()]

    log = open_log(tmp_path)
    log.append_as_leader(txn_batch(4, 0, 2), 0, 1000)                                   # 0-1
    log.append_as_leader(marker(4, False, coordinator_epoch=7), 0, 1000,
                         markers_allowed=True)                                          # 2
    log.append_as_leader(txn_batch(4, 2), 0, 1000)                                      # 3
    log.append_as_leader(marker(4, True, coordinator_epoch=7), 0, 1000,
                         markers_allowed=True)                                          # 4
    log.close()
    code, events = dump(str(log.dir))
    assert code == 0, [e for e in events if e["type"] == "problem"]
    batches = [e for e in events if e["type"] == "batch"]
    assert [(b["is_transactional"], b["is_control"]) for b in batches] == [
        (True, False), (True, True), (True, False), (True, True)]
    assert [(e["offset"], e["marker"], e["coordinator_epoch"]) for e in events
            if e["type"] == "control_record"] == [(2, "ABORT", 7), (4, "COMMIT", 7)]
    [entry] = [e for e in events if e["type"] == "txn_index_entry"]
    assert (entry["producer_id"], entry["first_offset"], entry["last_offset"],
            entry["last_stable_offset"]) == (4, 0, 2, 3)
    # A torn entry at the end is named, the whole ones still shown.
    index = txn_index_path(log.dir, 0)
    index.write_bytes(index.read_bytes() + b"\x00\x00\x01")
    code, events = dump(str(index))
    assert [e["problem"] for e in events if e["type"] == "problem"] == ["torn_tail"]
    assert len([e for e in events if e["type"] == "txn_index_entry"]) == 1


# -- compaction ----------------------------------------------------------------------

def test_the_cleaner_drops_aborted_data_keeps_committed_and_markers_and_stops_at_the_lso(
        tmp_path):
    from tidewater.broker.storage.cleaner import LogCleaner
    from tidewater.proto.records import decode_batch_records

    config = LogConfig.from_configs({"cleanup.policy": "compact", "segment.bytes": "400",
                                     "min.cleanable.dirty.ratio": "0",
                                     "delete.retention.ms": "1000"})
    log = Log.open(tmp_path / "t-0", config, now_ms=0)

    def keyed(pid: int, seq: int, key: bytes, value: bytes) -> bytes:
        return encode_batch([(key, value)], producer_id=pid, producer_epoch=0,
                            base_sequence=seq, attributes=TRANSACTIONAL_MASK,
                            base_timestamp_ms=1000)

    log.append_as_leader(encode_batch([(b"k", b"committed-old")], base_timestamp_ms=1000),
                         0, 1000)                                                   # 0
    log.append_as_leader(keyed(1, 0, b"k", b"aborted"), 0, 1000)                    # 1
    log.append_as_leader(marker(1, False), 0, 1000, markers_allowed=True)           # 2
    log.append_as_leader(keyed(2, 0, b"j", b"committed-txn"), 0, 1000)              # 3
    log.append_as_leader(marker(2, True), 0, 1000, markers_allowed=True)            # 4
    log.append_as_leader(keyed(3, 0, b"k", b"open"), 0, 1000)                       # 5: open
    for i in range(12):                                                             # 6..
        log.append_as_leader(encode_batch([(b"z%d" % i, b"x")], base_timestamp_ms=1000),
                             0, 1000)
    assert log.first_unstable_offset == 5
    log.flush()
    [result] = LogCleaner(log.dir.parent).clean_logs(
        {TopicPartition("t", 0): log}, {TopicPartition("t", 0): log.log_end_offset}, 10_000)
    assert 2 < result.clean_end_offset <= 5  # never past the LSO

    def values_by_offset() -> dict[int, bytes | None]:
        out: dict[int, bytes | None] = {}
        offset = log.log_start_offset
        while offset < log.log_end_offset:
            read = log.read(offset, 1 << 20)
            for position, header in iter_batches(read.records):
                if header.is_control:
                    out[header.base_offset] = b"<marker>"
                    continue
                for r in decode_batch_records(read.records, position, header):
                    out[r.offset] = r.value
            offset = read.next_offset
        return out
    after = values_by_offset()
    # The aborted value did not shadow the committed one, and it is gone itself.
    assert after[0] == b"committed-old"
    assert 1 not in after
    assert after[2] == after[4] == b"<marker>"
    assert after[3] == b"committed-txn"
    assert after[5] == b"open"
    # The index still names the aborted transaction, on disk too (a reader of an older
    # snapshot of the log, or a replica not cleaned yet, may still hold its records).
    assert log.aborted_transactions(0, 100) == [AbortedTxn(1, 1, 2, 3)]
    log.close()
    reopened = Log.open(tmp_path / "t-0", config, now_ms=0)
    assert reopened.aborted_transactions(0, 100) == [AbortedTxn(1, 1, 2, 3)]
    reopened.close()


def test_an_abort_with_a_bumped_epoch_fences_the_zombie_and_the_new_epoch_starts_at_zero(
        tmp_path):
    log = open_log(tmp_path)
    log.append_as_leader(txn_batch(1, 0, epoch=0), 0, 1000)
    # The coordinator fenced the producer (InitProducerId again): ABORT with epoch 1.
    log.append_as_leader(marker(1, False, epoch=1), 0, 1000, markers_allowed=True)
    assert log.first_unstable_offset is None
    with pytest.raises(InvalidProducerEpochError):  # the zombie's late batch
        log.append_as_leader(txn_batch(1, 1, epoch=0), 0, 1000)
    log.append_as_leader(txn_batch(1, 0, epoch=1), 0, 1000)  # the new incarnation
    assert log.first_unstable_offset == 2
    log.close()


# -- read_committed, end to end in process ------------------------------------------

def _committed_view(log: Log, start: int) -> list[bytes]:
    """What a read_committed consumer gets from ``start``: the log below the LSO, the
    aborted list as the fetch path computes it, filtered by Tidewater's consumer."""
    from tidewater.client.consumer import Consumer
    from tidewater.client.metadata import TopicPartition as ClientTP

    first_unstable = log.first_unstable_offset
    stable_end = log.log_end_offset if first_unstable is None else first_unstable
    consumer = Consumer.__new__(Consumer)  # only the decoder: no connections
    tp = ClientTP("t", 0)
    consumer._positions = {tp: start}
    out: list[bytes] = []
    offset = start
    while offset < stable_end:
        read = log.read(offset, 1 << 20, max_offset=stable_end)
        if not read.records:
            break
        aborted = [(a.producer_id, a.first_offset)
                   for a in log.aborted_transactions(offset, stable_end)]
        out += [r.value for r in consumer._decode(tp, read.records, None, aborted)]
        offset = read.next_offset
    return out


@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=_ops, start_fraction=st.floats(0, 1))
def test_read_committed_returns_exactly_the_committed_records(tmp_path_factory, ops,
                                                              start_fraction):
    tmp_path = tmp_path_factory.mktemp("rc")
    log = open_log(tmp_path, segment_bytes=400)
    sequences = {0: 0, 1: 0, 2: 0}
    pending: dict[int, list[tuple[int, bytes]]] = {}  # producer -> its open records
    committed: list[tuple[int, bytes]] = []  # (offset, value) of visible records
    for n, (kind, pid) in enumerate(ops):
        value = b"%s-%d-%d" % (kind.encode(), pid, n)
        if kind == "txn":
            info = log.append_as_leader(encode_batch(
                [(None, value)], producer_id=10 + pid, producer_epoch=0,
                base_sequence=sequences[pid], attributes=TRANSACTIONAL_MASK,
                base_timestamp_ms=1000), 0, 1000)
            sequences[pid] += 1
            pending.setdefault(pid, []).append((info.first_offset, value))
        elif kind == "plain" and pid not in pending:
            info = log.append_as_leader(encode_batch([(None, value)], base_timestamp_ms=1000),
                                        0, 1000)
            committed.append((info.first_offset, value))
        elif kind in ("commit", "abort"):
            log.append_as_leader(marker(10 + pid, kind == "commit"), 0, 1000,
                                 markers_allowed=True)
            records = pending.pop(pid, [])
            if kind == "commit":
                committed += records
        elif kind == "roll":
            log.roll(1000)
    open_firsts = [records[0][0] for records in pending.values() if records]
    stable_end = min(open_firsts, default=log.log_end_offset)
    first_unstable = log.first_unstable_offset
    assert (log.log_end_offset if first_unstable is None else first_unstable) == stable_end
    start = int(start_fraction * stable_end)
    expected = [v for offset, v in sorted(committed) if start <= offset < stable_end]
    # A fetch returns whole batches: one starting inside a batch is never asked here
    # (single-record batches), so ``start`` is any offset.
    assert _committed_view(log, start) == expected
    log.close()


def test_markers_go_in_two_passes_after_their_data_and_the_delete_horizon(tmp_path):
    from tidewater.broker.storage.cleaner import LogCleaner
    from tidewater.broker.storage.cleaner_rewrite import DELETE_HORIZON_MASK

    config = LogConfig.from_configs({"cleanup.policy": "compact", "segment.bytes": "400",
                                     "min.cleanable.dirty.ratio": "0",
                                     "delete.retention.ms": "1000"})
    log = Log.open(tmp_path / "t-0", config, now_ms=0)
    tp = TopicPartition("t", 0)

    def keyed(pid: int, seq: int, key: bytes) -> bytes:
        return encode_batch([(key, b"v")], producer_id=pid, producer_epoch=0,
                            base_sequence=seq, attributes=TRANSACTIONAL_MASK,
                            base_timestamp_ms=1000)

    log.append_as_leader(keyed(1, 0, b"a"), 0, 1000)                           # 0 aborted
    log.append_as_leader(marker(1, False), 0, 1000, markers_allowed=True)      # 1
    log.append_as_leader(keyed(2, 0, b"b"), 0, 1000)                           # 2 committed
    log.append_as_leader(marker(2, True), 0, 1000, markers_allowed=True)       # 3
    log.append_as_leader(keyed(2, 1, b"b"), 0, 1000)                           # 4 supersedes 2
    log.append_as_leader(marker(2, True), 0, 1000, markers_allowed=True)       # 5
    log.append_as_leader(keyed(1, 1, b"c"), 0, 1000)                           # 6: 1's later txn
    log.append_as_leader(marker(1, True), 0, 1000, markers_allowed=True)       # 7
    for i in range(12):
        log.append_as_leader(encode_batch([(b"z%d" % i, b"x")], base_timestamp_ms=1000),
                             0, 1000)
    log.flush()

    cleaner = LogCleaner(log.dir.parent)
    passes = iter(range(100))

    def clean_pass(now_ms: int) -> None:
        # Something new to clean (a pass needs dirty data): more records, rolled.
        n = next(passes)
        for i in range(4):
            log.append_as_leader(encode_batch([(b"y%d-%d" % (n, i), b"x")],
                                              base_timestamp_ms=1000), 0, 1000)
        log.roll(1000)
        log.flush()
        [result] = cleaner.clean_logs({tp: log}, {tp: log.log_end_offset}, now_ms)
        assert result.clean_end_offset > 7

    def batches() -> dict[int, tuple[bool, bool]]:
        """base offset -> (is control, stamped with a delete horizon)"""
        out = {}
        offset = log.log_start_offset
        while offset < log.log_end_offset:
            read = log.read(offset, 1 << 20)
            for _position, header in iter_batches(read.records):
                out[header.base_offset] = (header.is_control,
                                           bool(header.attributes & DELETE_HORIZON_MASK))
            offset = read.next_offset
        return out

    clean_pass(10_000)  # data goes: 0 aborted, 2 superseded; their markers met it and stay
    first = batches()
    assert 0 not in first and 2 not in first
    assert first[1] == first[3] == (True, False)
    assert log.aborted_transactions(0, 100) == [AbortedTxn(1, 0, 1, 2)]
    clean_pass(20_000)  # no data of theirs left: stamped, horizon 21_000
    second = batches()
    assert second[1] == second[3] == (True, True)
    assert second[5] == second[7] == (True, False)  # their data (4, 6) is still there
    clean_pass(20_500)  # before the horizon: kept
    assert batches()[1] == (True, True)
    clean_pass(21_000)  # the horizon: both go, with the ABORT's index entry
    third = batches()
    assert 1 not in third and 3 not in third
    assert log.aborted_transactions(0, 100) == []
    assert third[5] == third[7] == (True, False)
    # Reopened from the files, nothing of the removed transactions is open.
    log.close()
    reopened = Log.open(tmp_path / "t-0", config, now_ms=0)
    assert reopened.first_unstable_offset is None
    assert reopened.aborted_transactions(0, 100) == []
    reopened.close()
