"""The simulation's in-memory log: crash semantics and its own format checks."""

import random

import pytest

from .network import Network
from .sim_log import Batch, LogInvariantError, SimLog, SimRecords


def append(log, count, epoch, payload_id):
    return log.append_as_leader(SimRecords(count, payload_id, b""), epoch, 0)


def log_with(*epochs_and_counts):
    log = SimLog()
    for payload_id, (epoch, count) in enumerate(epochs_and_counts, start=1):
        append(log, count, epoch, payload_id)
    return log


def test_crash_keeps_the_flushed_prefix_and_truncates_the_cache():
    log = log_with((0, 2), (0, 1))
    log.flush()
    append(log, 3, 1, 9)  # epoch 1 from offset 3, unflushed
    outcomes = set()
    for seed in range(20):
        copy = SimLog()
        copy.append_as_follower(tuple(log.batches))
        copy.flushed_offset = 3
        leo = copy.crash(random.Random(seed))
        assert leo in (3, 6)
        assert copy.batches == (log.batches[:2] if leo == 3 else log.batches)
        assert copy.cache.entries() == ([(0, 0)] if leo == 3 else [(0, 0), (1, 3)])
        copy.check()
        outcomes.add(leo)
    assert outcomes == {3, 6}  # a crash may lose the unflushed tail, or not


def test_truncate_never_splits_a_batch():
    log = log_with((0, 3), (1, 2))  # [0..2] epoch 0, [3..4] epoch 1
    log.truncate_to(4)
    assert log.log_end_offset == 3 and log.cache.entries() == [(0, 0)]
    log.check()


def test_check_catches_gaps_decreasing_epochs_and_cache_mismatch():
    log = log_with((0, 1), (1, 1))
    log.check()
    bad = SimLog()
    bad.batches = [Batch(0, 0, 0, 1), Batch(2, 2, 0, 2)]
    bad.cache.assign(0, 0)
    with pytest.raises(LogInvariantError, match="contiguous"):
        bad.check()
    bad = SimLog()
    bad.batches = [Batch(0, 0, 1, 1), Batch(1, 1, 0, 2)]
    bad.cache.assign(1, 0)
    with pytest.raises(LogInvariantError, match="epoch went down"):
        bad.check()
    log.cache.truncate_from_end(1)  # the cache forgot epoch 1 but the batch is there
    log._checked_truncations = -1  # force a full re-check
    with pytest.raises(LogInvariantError, match="epoch cache"):
        log.check()


def test_leader_epoch_with_no_batch_yet_is_allowed_at_the_end_only():
    log = log_with((0, 2))
    log.cache.assign(3, 2)  # became leader in epoch 3 at LEO 2
    log.check()


def test_network_cut_drops_both_ways_until_healed():
    net = Network(random.Random(1), loss_probability=0.0, delay_ms_min=1, delay_ms_max=1)
    net.cut(1, 2, until_ms=100)
    net.send(1, 2, "a", 0)
    net.send(2, 1, "b", 0)
    net.send(1, 3, "c", 0)
    assert [e.message for e in net.deliverable(10)] == ["c"]
    net.send(1, 2, "d", 100)
    assert [e.message for e in net.deliverable(200)] == ["d"]
