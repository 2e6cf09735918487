"""Idempotent producers' state: the pure rules (producer_state.py), the snapshot format,
and the log that keeps them across appends, followers, rolls, restarts, truncation,
retention and expiry."""

import errno
import os
import struct
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tidewater.broker.storage.log import Log
from tidewater.broker.storage.log_config import LogConfig
from tidewater.broker.storage.producer_state import (
    SEQUENCE_MAX,
    Duplicate,
    ProducerBatch,
    ProducerStateManager,
    decode_snapshot,
    first_sequence_of,
    last_sequence_of,
    snapshot_file_name,
)
from tidewater.proto.errors import (
    CorruptFileError,
    InvalidProducerEpochError,
    KafkaStorageError,
    OutOfOrderSequenceError,
    UnknownProducerIdError,
)
from tidewater.proto.records import encode_batch

PID = 7


def check(state, pid, epoch, seq, count=1):
    return state.check_leader_append([ProducerBatch(pid, epoch, seq, count - 1)])


def record(state, pid, epoch, seq, first_offset, count=1, ts=1000):
    state.on_batch(pid, epoch, seq, first_offset, first_offset + count - 1, ts)


# ---------------------------------------------------------------- the rules


def test_first_batch_of_a_producer_must_start_at_zero():
    state = ProducerStateManager()
    assert check(state, PID, 0, 0) is None
    with pytest.raises(UnknownProducerIdError):
        check(state, PID, 0, 5)


def test_next_batch_in_sequence_is_appended_a_gap_is_out_of_order():
    state = ProducerStateManager()
    record(state, PID, 0, 0, first_offset=10, count=3)  # sequences 0..2
    assert check(state, PID, 0, 3) is None
    with pytest.raises(OutOfOrderSequenceError):
        check(state, PID, 0, 4)


def test_a_retry_of_one_of_the_last_five_batches_gets_its_original_offsets():
    state = ProducerStateManager()
    for i in range(7):
        record(state, PID, 0, i * 2, first_offset=100 + i * 2, count=2)
    # batches 2..6 are remembered (sequences 4..13)
    assert check(state, PID, 0, 4, count=2) == Duplicate(104, 105)
    assert check(state, PID, 0, 12, count=2) == Duplicate(112, 113)
    # older than the last five: a repeat the broker cannot answer
    with pytest.raises(OutOfOrderSequenceError):
        check(state, PID, 0, 2, count=2)
    # same first sequence, other batching: not the same batch
    with pytest.raises(OutOfOrderSequenceError):
        check(state, PID, 0, 12, count=1)


def test_old_epoch_is_refused_new_epoch_must_start_at_zero():
    state = ProducerStateManager()
    record(state, PID, 3, 0, first_offset=0, count=5)
    with pytest.raises(InvalidProducerEpochError):
        check(state, PID, 2, 5)
    with pytest.raises(OutOfOrderSequenceError):
        check(state, PID, 4, 5)
    assert check(state, PID, 4, 0) is None
    # a duplicate is one of the same epoch only
    assert check(state, PID, 3, 0, count=5) == Duplicate(0, 4)
    record(state, PID, 4, 0, first_offset=5)
    assert state.entries[PID].producer_epoch == 4
    assert [b.first_offset for b in state.entries[PID].batches] == [5]


def test_batches_of_one_append_are_checked_in_order():
    state = ProducerStateManager()
    record(state, PID, 0, 0, first_offset=0)
    ok = [ProducerBatch(PID, 0, 1, 1), ProducerBatch(PID, 0, 3, 0), ProducerBatch(9, 0, 0, 0)]
    assert state.check_leader_append(ok) is None
    with pytest.raises(OutOfOrderSequenceError):
        state.check_leader_append([ProducerBatch(PID, 0, 1, 1), ProducerBatch(PID, 0, 4, 0)])
    assert state.check_leader_append([ProducerBatch(-1, -1, -1, 0)]) is None


def test_a_producer_batch_without_sequence_is_refused():
    with pytest.raises(OutOfOrderSequenceError):
        check(ProducerStateManager(), PID, 0, -1)


def test_sequences_wrap_after_int32_max():
    assert last_sequence_of(SEQUENCE_MAX - 1, 3) == 1
    assert first_sequence_of(1, 3) == SEQUENCE_MAX - 1
    state = ProducerStateManager()
    record(state, PID, 0, 0, first_offset=0)
    state.entries[PID].batches[-1] = state.entries[PID].batches[-1]._replace(
        last_sequence=SEQUENCE_MAX)
    assert check(state, PID, 0, 0) is None


def test_producers_expire_by_their_last_timestamp():
    state = ProducerStateManager(expiration_ms=1000)
    record(state, 1, 0, 0, 0, ts=100)
    record(state, 2, 0, 0, 1, ts=900)
    assert state.remove_expired(1100) == [1]
    assert list(state.entries) == [2]
    with pytest.raises(UnknownProducerIdError):
        check(state, 1, 0, 1)


# ---------------------------------------------------------------- snapshot format


def test_snapshot_is_kafkas_version_1_layout():
    state = ProducerStateManager()
    record(state, PID, 2, 10, first_offset=40, count=3, ts=1234)
    data = state.snapshot_bytes()
    version, _crc, count = struct.unpack_from(">hIi", data)
    assert (version, count, len(data)) == (1, 1, 10 + 46)
    assert struct.unpack_from(">qhiqiqiq", data, 10) == (PID, 2, 12, 42, 2, 1234, -1, -1)
    (entry,) = decode_snapshot(data)
    assert (entry.batches[-1].first_sequence, entry.batches[-1].first_offset) == (10, 40)


@pytest.mark.parametrize("damage", ["short", "crc", "version", "count"])
def test_a_damaged_snapshot_is_a_corrupt_file(damage):
    state = ProducerStateManager()
    record(state, PID, 0, 0, 0)
    data = bytearray(state.snapshot_bytes())
    if damage == "short":
        data = data[:8]
    elif damage == "crc":
        data[-1] ^= 1
    elif damage == "version":
        data[1] = 2
    else:
        data += b"\0" * 46  # CRC recomputed: the count no longer matches the length
        from crc32c import crc32c
        struct.pack_into(">I", data, 2, crc32c(bytes(data[6:])))
    with pytest.raises(CorruptFileError):
        decode_snapshot(bytes(data))


# ---------------------------------------------------------------- property: the model

# A producer's life: sends numbered batches, sometimes retries one of the last few,
# sometimes skips (a lost batch), sometimes bumps its epoch. The model says what Kafka does.
ops = st.lists(st.tuples(st.sampled_from(["send", "retry", "gap", "bump", "old_epoch"]),
                         st.integers(1, 4), st.integers(0, 6)), max_size=60)


@settings(max_examples=200, deadline=None)
@given(ops)
def test_state_against_a_model(script):
    state = ProducerStateManager()
    epoch, next_seq, next_offset = 0, 0, 0
    written: list[tuple[int, int, int, int]] = []  # epoch, first seq, last seq, first offset
    for op, count, back in script:
        if op == "send":
            assert check(state, PID, epoch, next_seq, count) is None
            record(state, PID, epoch, next_seq, next_offset, count)
            written.append((epoch, next_seq, next_seq + count - 1, next_offset))
            next_seq += count
            next_offset += count
        elif op == "retry" and written:
            e, first, last, offset = written[-1 - back % len(written)]
            broker_epoch = written[-1][0]  # a bump shows only with the new epoch's batch
            recent = [w for w in written if w[0] == broker_epoch][-5:]
            if e == broker_epoch and (e, first, last, offset) in recent:
                assert check(state, PID, e, first, last - first + 1) == Duplicate(
                    offset, offset + last - first)
            elif e < broker_epoch:
                with pytest.raises(InvalidProducerEpochError):
                    check(state, PID, e, first, last - first + 1)
            else:
                with pytest.raises(OutOfOrderSequenceError):
                    check(state, PID, e, first, last - first + 1)
        elif op == "gap" and written and written[-1][0] == epoch:
            with pytest.raises(OutOfOrderSequenceError):
                check(state, PID, epoch, next_seq + 1 + back, count)
        elif op == "bump":
            epoch, next_seq = epoch + 1, 0
        elif op == "old_epoch" and written and written[-1][0] > 0:
            with pytest.raises(InvalidProducerEpochError):
                check(state, PID, written[-1][0] - 1, 0, count)
        # a follower rebuilding from the same batches has the same state
        follower = ProducerStateManager()
        for e, first, last, offset in written:
            follower.on_batch(PID, e, first, offset, offset + last - first, 1000)
        assert follower.entries == state.entries


# ---------------------------------------------------------------- the log keeps it


def pbatch(seq, n=1, epoch=0, pid=PID, ts=1000):
    return encode_batch([(None, b"v")] * n, base_timestamp_ms=ts, producer_id=pid,
                        producer_epoch=epoch, base_sequence=seq)


def open_log(path, **config):
    return Log.open(path, LogConfig(**config), now_ms=0)


def test_leader_append_answers_a_retry_with_the_original_offsets(tmp_path):
    log = open_log(tmp_path / "t-0")
    first = log.append_as_leader(pbatch(0, 3), 0, now_ms=1)
    log.append_as_leader(pbatch(3, 2), 0, now_ms=1)
    retry = log.append_as_leader(pbatch(0, 3), 0, now_ms=1)
    assert retry.duplicate and (retry.first_offset, retry.last_offset) == (0, 2)
    assert not first.duplicate and log.log_end_offset == 5
    with pytest.raises(OutOfOrderSequenceError):
        log.append_as_leader(pbatch(9), 0, now_ms=1)
    assert log.log_end_offset == 5


def test_a_follower_builds_the_same_state_from_the_batches_it_copies(tmp_path):
    leader = open_log(tmp_path / "t-0")
    follower = open_log(tmp_path / "t-1")
    leader.append_as_leader(pbatch(0, 2) + pbatch(0, 1, pid=8), 0, now_ms=1)
    leader.append_as_leader(pbatch(2), 0, now_ms=1)
    data = leader.read(0, 1 << 20).records
    follower.append_as_follower(data, now_ms=1)
    assert follower.producer_state.entries == leader.producer_state.entries
    assert follower.append_as_leader(pbatch(2), 1, now_ms=1).first_offset == 3


def test_state_survives_a_clean_restart_and_a_crash(tmp_path):
    log = open_log(tmp_path / "t-0", segment_bytes=400)
    for seq in range(12):
        log.append_as_leader(pbatch(seq), 0, now_ms=1)
    assert len(log.producer_snapshot_offsets()) >= 2  # one per roll
    entries = dict(log.producer_state.entries)
    log.close()
    assert log.producer_snapshot_offsets()[-1] == 12  # the clean shutdown's
    reopened = Log.open(tmp_path / "t-0", LogConfig(segment_bytes=400), now_ms=0,
                        had_clean_shutdown=True)
    assert reopened.producer_state.entries[PID].last_offset == entries[PID].last_offset
    assert reopened.append_as_leader(pbatch(11), 0, now_ms=1).duplicate
    # A crash: no shutdown snapshot; the batches after the last roll's snapshot rebuild it.
    reopened.append_as_leader(pbatch(12), 0, now_ms=1)
    reopened.append_as_leader(pbatch(13), 0, now_ms=1)
    (tmp_path / "t-0" / snapshot_file_name(12)).unlink()
    crashed = Log.open(tmp_path / "t-0", LogConfig(segment_bytes=400), now_ms=0)
    dup = crashed.append_as_leader(pbatch(13), 0, now_ms=1)
    assert dup.duplicate and dup.first_offset == 13
    assert crashed.append_as_leader(pbatch(12), 0, now_ms=1).first_offset == 12
    assert crashed.append_as_leader(pbatch(14), 0, now_ms=1).first_offset == 14


def test_a_torn_snapshot_falls_back_to_an_older_one(tmp_path):
    log = open_log(tmp_path / "t-0", segment_bytes=400)
    for seq in range(12):
        log.append_as_leader(pbatch(seq), 0, now_ms=1)
    latest = log.producer_snapshot_offsets()[-1]
    path = tmp_path / "t-0" / snapshot_file_name(latest)
    path.write_bytes(path.read_bytes()[:-3])
    reopened = Log.open(tmp_path / "t-0", LogConfig(segment_bytes=400), now_ms=0)
    assert not path.exists()
    assert reopened.append_as_leader(pbatch(11), 0, now_ms=1).duplicate
    assert reopened.append_as_leader(pbatch(12), 0, now_ms=1).first_offset == 12


def test_truncation_moves_the_state_back(tmp_path):
    log = open_log(tmp_path / "t-0", segment_bytes=400)
    for seq in range(12):
        log.append_as_leader(pbatch(seq), 0, now_ms=1)
    log.truncate_to(5)
    assert all(o <= 5 for o in log.producer_snapshot_offsets())
    assert log.producer_state.entries[PID].last_sequence == 4
    assert log.append_as_leader(pbatch(5), 1, now_ms=1).first_offset == 5
    log.truncate_fully_and_start_at(100)
    assert log.producer_snapshot_offsets() == [] and not log.producer_state.entries
    with pytest.raises(UnknownProducerIdError):
        log.append_as_leader(pbatch(6), 1, now_ms=1)


def test_retention_keeps_producers_and_drops_their_old_snapshots(tmp_path):
    log = open_log(tmp_path / "t-0", segment_bytes=400, retention_bytes=0)
    for seq in range(12):
        log.append_as_leader(pbatch(seq), 0, now_ms=1)
    assert log.delete_old_segments(now_ms=1, high_watermark=12) > 0
    assert min(log.producer_snapshot_offsets()) >= log.log_start_offset
    assert log.append_as_leader(pbatch(11), 0, now_ms=1).duplicate
    assert log.append_as_leader(pbatch(12), 0, now_ms=1).first_offset == 12


def test_expired_producers_are_forgotten_also_across_a_restart(tmp_path):
    log = Log.open(tmp_path / "t-0", LogConfig(), now_ms=0, producer_id_expiration_ms=1000)
    log.append_as_leader(pbatch(0, ts=5000), 0, now_ms=1)
    assert log.remove_expired_producers(5500) == []
    log.close()
    reopened = Log.open(tmp_path / "t-0", LogConfig(), now_ms=7000, had_clean_shutdown=True,
                        producer_id_expiration_ms=1000)
    assert not reopened.producer_state.entries
    with pytest.raises(UnknownProducerIdError):
        reopened.append_as_leader(pbatch(1), 0, now_ms=1)


def test_a_failed_append_write_changes_no_producer_state(tmp_path, monkeypatch):
    log = open_log(tmp_path / "t-0")
    log.append_as_leader(pbatch(0), 0, now_ms=1)
    real_write = os.write

    def failing_write(fd, data):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "write", failing_write)
    monkeypatch.setattr(os, "writev", failing_write, raising=False)
    with pytest.raises(KafkaStorageError):
        log.append_as_leader(pbatch(1), 0, now_ms=1)
    monkeypatch.setattr(os, "write", real_write)
    monkeypatch.undo()
    assert log.producer_state.entries[PID].last_sequence == 0
    assert log.append_as_leader(pbatch(1), 0, now_ms=1).first_offset == 1


def test_the_log_managers_retention_pass_expires_idle_producers(tmp_path):
    from tidewater.broker.storage.log_manager import LogManager
    from tidewater.broker.storage.topics import TopicPartition

    manager = LogManager(tmp_path, LogConfig(), producer_id_expiration_ms=1000)
    manager.load(now_ms=0)
    tp = TopicPartition("t", 0)
    log = manager.get_or_create(tp, LogConfig(), now_ms=0)
    log.append_as_leader(pbatch(0, ts=5000), 0, now_ms=1)
    manager.delete_old_segments(5500, {tp: 1})
    assert PID in log.producer_state.entries
    manager.delete_old_segments(6000, {tp: 1})
    assert PID not in log.producer_state.entries
    manager.shutdown()


def test_a_duplicate_that_comes_with_a_new_batch_is_refused_whole():
    from tidewater.proto.errors import InvalidRequestError

    state = ProducerStateManager()
    record(state, PID, 0, 0, first_offset=0, count=2)
    record(state, PID, 0, 2, first_offset=2, count=1)
    both = [ProducerBatch(PID, 0, 0, 1), ProducerBatch(PID, 0, 2, 0)]
    assert state.check_leader_append(both) == Duplicate(0, 2)  # a whole request again
    with pytest.raises(InvalidRequestError):  # answering 0 would ack the new batch unwritten
        state.check_leader_append([ProducerBatch(PID, 0, 2, 0), ProducerBatch(PID, 0, 3, 0)])
    with pytest.raises(InvalidRequestError):
        state.check_leader_append([ProducerBatch(PID, 0, 2, 0), ProducerBatch(-1, -1, -1, 0)])


def test_snapshot_writes_that_fail_only_warn(tmp_path, monkeypatch):
    """A roll's or a shutdown's snapshot that cannot be written only warns: appends go on,
    and the next open, finding no snapshot, rebuilds the producers from the active
    segment's batches (those a retry can concern)."""
    from pathlib import Path

    from tidewater.broker.storage import log as log_module

    def full_disk(*_args, **_kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    log = open_log(tmp_path / "t-0", segment_bytes=400)
    monkeypatch.setattr(Path, "write_bytes", full_disk)
    for seq in range(12):  # rolls happen
        log.append_as_leader(pbatch(seq), 0, now_ms=1)
    monkeypatch.setattr(log_module, "write_file_atomically", full_disk)
    log.close()
    monkeypatch.undo()
    assert log.producer_snapshot_offsets() == []
    reopened = Log.open(tmp_path / "t-0", LogConfig(segment_bytes=400), now_ms=0,
                        had_clean_shutdown=True)
    assert reopened.append_as_leader(pbatch(11), 0, now_ms=1).duplicate
    assert reopened.append_as_leader(pbatch(12), 0, now_ms=1).first_offset == 12


def test_a_log_without_any_snapshot_reads_only_its_active_segment(tmp_path):
    """A log written before producer state existed: no GiB scan on the first open."""
    log = open_log(tmp_path / "t-0", segment_bytes=400)
    for seq in range(12):
        mine = seq >= 10
        log.append_as_leader(pbatch(seq - 10 if mine else seq, pid=PID if mine else 99), 0,
                             now_ms=1)
    log.close()
    for offset in log.producer_snapshot_offsets():
        (tmp_path / "t-0" / snapshot_file_name(offset)).unlink()
    reopened = Log.open(tmp_path / "t-0", LogConfig(segment_bytes=400), now_ms=0,
                        had_clean_shutdown=True)
    active_base = reopened.active_segment.base_offset
    assert 0 < active_base <= 10
    assert PID in reopened.producer_state.entries  # its batches are in the active segment
    assert reopened.append_as_leader(pbatch(1), 0, now_ms=1).duplicate


# ------------------------------------------- property: the log keeps the dedup of retries

# What a replica of one partition goes through in a chaos run, for two idempotent
# producers: appends as leader, retries of a producer's last batch (its answer was lost:
# a REQUEST_TIMED_OUT or NOT_LEADER_OR_FOLLOWER acks=all outcome, a dropped connection),
# epoch bumps, rolls, retention, truncation (a follower cut back to its leader's log), a
# crash or clean restart, and a leader change to a follower that copied the whole log.
life = st.lists(st.one_of(
    st.tuples(st.just("append"), st.sampled_from([7, 8]), st.integers(1, 3)),
    st.tuples(st.just("bump"), st.sampled_from([7, 8]), st.just(1)),
    st.tuples(st.just("retry"), st.sampled_from([7, 8]), st.just(0)),
    st.tuples(st.just("truncate"), st.integers(0, 40), st.just(0)),
    st.tuples(st.sampled_from(["roll", "retention", "crash", "restart", "new_leader"]),
              st.just(0), st.just(0)),
), max_size=40)


@pytest.mark.timeout(300)
@settings(max_examples=300, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(life)
def test_a_retry_of_a_batch_still_in_the_log_is_never_written_twice(tmp_path, script):
    """The broker's half of "no duplicate from an idempotent producer": whatever the
    replica went through, a retry (same epoch and sequences) of a producer's last batch
    still in the log gets that batch's offsets, nothing written; the producer's next
    batch is taken (never UNKNOWN_PRODUCER_ID while its state can be rebuilt from the
    log). What the broker cannot dedup is a re-send under a new epoch (librdkafka's
    renumbering after an epoch bump): a new batch to every broker, as in Kafka."""
    config = LogConfig(segment_bytes=200, retention_bytes=400)
    path = Path(tempfile.mkdtemp(dir=tmp_path))
    opened: list[Log] = []  # closed after the example: a crash drops its log unclosed
    try:
        _retries_of_the_last_batch(config, path, script, opened)
    finally:
        for log in opened:
            try:
                log.close()
            except Exception:  # a crashed log: its files are only released
                pass


def _retries_of_the_last_batch(config: LogConfig, path: Path, script, opened: list[Log]) -> None:
    def open_log(directory: Path, **kwargs) -> Log:
        log = Log.open(directory, config, now_ms=0, **kwargs)
        opened.append(log)
        return log

    log = open_log(path / "t-0")
    # Every batch written: [pid, epoch, base seq, count, first offset, below log start]
    written: list[list[int]] = []
    epochs = {7: 0, 8: 0}
    copies = 0
    for op, a, b in script:
        if op in ("append", "bump"):
            pid, count = a, b
            epochs[pid] += op == "bump"
            same = [w for w in written if w[0] == pid and w[1] == epochs[pid]]
            seq = same[-1][2] + same[-1][3] if same else 0
            info = log.append_as_leader(pbatch(seq, count, epochs[pid], pid), 0, now_ms=1)
            assert not info.duplicate
            written.append([pid, epochs[pid], seq, count, info.first_offset, 0])
        elif op == "retry":
            present = [w for w in written if w[0] == a and not w[5]]
            if present and present[-1] is [w for w in written if w[0] == a][-1]:
                pid, epoch, seq, count, first, _ = present[-1]
                info = log.append_as_leader(pbatch(seq, count, epoch, pid), 0, now_ms=1)
                assert info.duplicate and info.first_offset == first
        elif op == "truncate":
            if a < log.log_start_offset:
                written = []  # the whole log goes, and every producer with it
            log.truncate_to(a)
            written = [w for w in written if w[4] + w[3] <= log.log_end_offset]
        elif op == "roll":
            log.roll(1)
        elif op == "retention":
            log.delete_old_segments(now_ms=1, high_watermark=log.log_end_offset)
            for w in written:
                w[5] = w[4] < log.log_start_offset
        elif op in ("crash", "restart"):
            if op == "restart":
                log.close()
            log = open_log(log.dir, had_clean_shutdown=op == "restart")
        else:  # a follower copied the log (from its start) and now leads
            # It never saw a producer whose batches all went with retention: that one's
            # next batch starts at 0 (the leader kept it, a new replica cannot know it:
            # UNKNOWN_PRODUCER_ID, producer_state.py's deliberate deviation from Kafka).
            gone = {w[0] for w in written} - {w[0] for w in written if not w[5]}
            written = [w for w in written if w[0] not in gone]
            copies += 1
            follower = open_log(path / f"t-{copies}")
            follower.truncate_fully_and_start_at(log.log_start_offset)
            while follower.log_end_offset < log.log_end_offset:
                follower.append_as_follower(
                    log.read(follower.log_end_offset, 1 << 20).records, now_ms=1)
            log = follower
        assert log.log_end_offset == max((w[4] + w[3] for w in written),
                                         default=log.log_end_offset)
