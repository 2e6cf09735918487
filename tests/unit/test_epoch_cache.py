"""LeaderEpochCache: every example and case of the replication reference, and its file."""

from __future__ import annotations

import os

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tidewater.broker.storage import checkpoints
from tidewater.broker.storage.epoch_cache import (
    LeaderEpochCache,
    format_epoch_checkpoint,
    read_epoch_checkpoint,
)
from tidewater.proto.errors import CorruptFileError, KafkaStorageError


def cache_of(*entries, path=None):
    return LeaderEpochCache(path, entries)


# -- assign ------------------------------------------------------------------

@pytest.mark.parametrize(
    ("before", "assign", "after"),
    [
        # The reference's examples.
        ([(5, 11), (6, 12), (7, 13)], (7, 12), [(5, 11), (7, 12)]),
        ([(1, 5), (2, 6)], (1, 7), [(1, 7)]),
        ([(2, 6)], (3, 5), [(3, 5)]),
        # An epoch keeps its first start offset.
        ([(2, 6)], (2, 6), [(2, 6)]),
        ([(2, 6)], (2, 9), [(2, 6)]),
        # ...unless the new start is below it (follower re-fetching after truncation).
        ([(1, 0), (2, 6)], (2, 4), [(1, 0), (2, 4)]),
        # Plain append of a newer epoch.
        ([], (0, 0), [(0, 0)]),
        ([(0, 0)], (1, 3), [(0, 0), (1, 3)]),
        # A newer epoch at the same start offset replaces the entry.
        ([(0, 0), (1, 3)], (2, 3), [(0, 0), (2, 3)]),
        # An older epoch than the latest removes every newer entry.
        ([(0, 0), (2, 5), (4, 9)], (1, 10), [(0, 0), (1, 10)]),
    ],
)
def test_assign(before, assign, after):
    cache = cache_of(*before)
    cache.assign(*assign)
    assert cache.entries() == after


@pytest.mark.parametrize("entry", [(-1, 0), (0, -1), (-1, -1)])
def test_assign_rejects_undefined_values(entry):
    cache = cache_of((1, 2))
    with pytest.raises(ValueError):
        cache.assign(*entry)
    assert cache.entries() == [(1, 2)]


def test_latest_and_start_queries():
    cache = cache_of()
    assert cache.latest_epoch == -1
    assert cache.latest_entry is None
    assert cache.epoch_start_offset(0) == -1
    cache = cache_of((0, 0), (2, 5), (4, 9))
    assert cache.latest_epoch == 4
    assert cache.latest_entry == (4, 9)
    assert cache.earliest_entry == (0, 0)
    assert [cache.epoch_start_offset(e) for e in range(6)] == [0, -1, 5, -1, 9, -1]
    assert [cache.epoch_for_offset(o) for o in (-1, 0, 4, 5, 8, 9, 100)] == [-1, 0, 0, 2, 2, 4, 4]


def test_constructor_rejects_unordered_entries():
    with pytest.raises(ValueError):
        cache_of((2, 5), (1, 6))
    with pytest.raises(ValueError):
        cache_of((1, 6), (2, 5))
    with pytest.raises(ValueError):
        cache_of((-1, 0))


# -- end_offset_for -------------------------------------------------------------

@pytest.mark.parametrize(
    ("entries", "requested", "leo", "expected"),
    [
        # requested == -1
        ([(0, 0), (1, 5)], -1, 10, (-1, -1)),
        ([], -1, 0, (-1, -1)),
        # requested == latest epoch -> LEO
        ([(0, 0), (1, 5)], 1, 10, (1, 10)),
        # no entry above requested (includes the empty cache)
        ([], 0, 0, (-1, -1)),
        ([], 3, 7, (-1, -1)),
        ([(0, 0), (1, 5)], 2, 10, (-1, -1)),
        ([(2, 100)], 3, 100, (-1, -1)),
        # some entry above, none at or below
        ([(5, 11), (6, 12), (7, 13)], 4, 20, (4, 11)),
        # otherwise: largest epoch <= requested, start of first entry above
        ([(0, 10), (2, 13), (4, 17)], 1, 20, (0, 13)),
        ([(0, 10), (2, 13), (4, 17)], 2, 20, (2, 17)),
        ([(0, 10), (2, 13), (4, 17)], 3, 20, (2, 17)),
        ([(1, 11), (2, 13), (3, 15)], 2, 17, (2, 15)),
        # epochs sharing a start offset
        ([(0, 0), (1, 0)], 1, 5, (1, 5)),
        ([(0, 0), (1, 0)], 0, 5, (0, 0)),
    ],
)
def test_end_offset_for(entries, requested, leo, expected):
    assert cache_of(*entries).end_offset_for(requested, leo) == expected


def test_end_offset_for_worked_example_of_follower_truncation():
    # Reference: leader (0,0),(2,5) LEO 8; follower (0,0),(1,3) LEO 6.
    leader = cache_of((0, 0), (2, 5))
    follower = cache_of((0, 0), (1, 3))
    answer = leader.end_offset_for(follower.latest_epoch, 8)
    assert answer == (0, 5)
    own = follower.end_offset_for(answer[0], 6)
    assert own == (0, 3)
    assert min(own[1], answer[1], 6) == 3


# -- truncation ---------------------------------------------------------------

@pytest.mark.parametrize(
    ("offset", "after"),
    [
        (8, [(2, 6)]),
        (9, [(2, 6), (3, 8)]),
        (6, []),
        (0, []),
        (11, [(2, 6), (3, 8)]),
        (12, [(2, 6), (3, 8), (4, 11)]),  # at or beyond the LEO: nothing to drop
        (1000, [(2, 6), (3, 8), (4, 11)]),
        (-1, [(2, 6), (3, 8), (4, 11)]),  # undefined: ignored
    ],
)
def test_truncate_from_end(offset, after):
    cache = cache_of((2, 6), (3, 8), (4, 11))
    cache.truncate_from_end(offset)
    assert cache.entries() == after


@pytest.mark.parametrize(
    ("offset", "after"),
    [
        (8, [(3, 8), (4, 11)]),
        (9, [(3, 9), (4, 11)]),
        (15, [(4, 15)]),
        (6, [(2, 6), (3, 8), (4, 11)]),
        (5, [(2, 6), (3, 8), (4, 11)]),
        (11, [(4, 11)]),
        (-1, [(2, 6), (3, 8), (4, 11)]),
    ],
)
def test_truncate_from_start(offset, after):
    cache = cache_of((2, 6), (3, 8), (4, 11))
    cache.truncate_from_start(offset)
    assert cache.entries() == after


def test_clear():
    cache = cache_of((2, 6), (3, 8))
    cache.clear()
    assert cache.entries() == []
    assert cache.latest_epoch == -1


def test_acceptance_scenario_basic_epochs_on_one_cache():
    # Scenario 1 of the reference, seen from the first leader's cache.
    cache = cache_of()
    cache.assign(0, 0)          # leader in epoch 0 writes 1 record
    cache.assign(1, 1)          # follower bounced: new epoch 1 at LEO 1
    cache.assign(1, 1)          # a batch of epoch 1 at offset 1: no change
    cache.assign(2, 2)          # leader bounced: epoch 2 at LEO 2
    assert cache.entries() == [(0, 0), (1, 1), (2, 2)]


# -- the file -----------------------------------------------------------------

def test_every_change_is_persisted(tmp_path):
    path = tmp_path / "leader-epoch-checkpoint"
    cache = LeaderEpochCache(path)
    assert not path.exists()  # nothing changed yet
    steps = [
        (lambda: cache.assign(0, 0), [(0, 0)]),
        (lambda: cache.assign(2, 5), [(0, 0), (2, 5)]),
        (lambda: cache.assign(3, 9), [(0, 0), (2, 5), (3, 9)]),
        (lambda: cache.truncate_from_end(9), [(0, 0), (2, 5)]),
        (lambda: cache.truncate_from_start(3), [(0, 3), (2, 5)]),
        (lambda: cache.clear(), []),
    ]
    for step, expected in steps:
        step()
        assert cache.entries() == expected
        assert LeaderEpochCache.load(path).entries() == expected
    assert path.read_bytes() == b"0\n0\n"
    assert not (tmp_path / "leader-epoch-checkpoint.tmp").exists()


def test_file_format_is_kafkas(tmp_path):
    path = tmp_path / "leader-epoch-checkpoint"
    cache = LeaderEpochCache(path)
    cache.assign(0, 0)
    cache.assign(1, 120)
    assert path.read_text() == "0\n2\n0 0\n1 120\n"
    assert format_epoch_checkpoint([(3, 4)]) == b"0\n1\n3 4\n"


def test_unchanged_assign_does_not_rewrite(tmp_path, monkeypatch):
    path = tmp_path / "leader-epoch-checkpoint"
    cache = LeaderEpochCache(path)
    cache.assign(1, 5)
    writes = []
    monkeypatch.setattr("tidewater.broker.storage.epoch_cache.write_file_atomically",
                        lambda p, d: writes.append(d))
    cache.assign(1, 7)
    cache.truncate_from_end(6)
    cache.truncate_from_start(5)
    assert writes == []


def test_in_memory_cache_writes_no_file(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    cache = LeaderEpochCache(None)
    cache.assign(0, 0)
    cache.clear()
    assert os.listdir(tmp_path) == []


def test_missing_and_empty_files_are_empty(tmp_path):
    path = tmp_path / "leader-epoch-checkpoint"
    assert LeaderEpochCache.load(path).entries() == []
    path.write_bytes(b"")
    assert LeaderEpochCache.load(path).entries() == []
    path.write_bytes(b"0\n0\n")
    assert LeaderEpochCache.load(path).entries() == []


@pytest.mark.parametrize(
    ("content", "line"),
    [
        (b"1\n0\n", 1),               # wrong version
        (b"x\n0\n", 1),
        (b"\n", 1),                   # blank version line
        (b"0\n", 2),                  # no count
        (b"0\nfoo\n", 2),             # malformed count
        (b"0\n-1\n", 2),
        (b"0\n2\n0 0\n", 2),          # fewer entries than the count
        (b"0\n1\n0 0\n1 5\n", 2),     # more entries than the count
        (b"0\n1\n0\n", 3),            # one field
        (b"0\n1\n0 0 0\n", 3),        # three fields
        (b"0\n1\n0 x\n", 3),
        (b"0\n1\n 0 0\n", 3),         # leading space
        (b"0\n1\n-1 0\n", 3),         # negative epoch
        (b"0\n1\n0 -5\n", 3),
        (b"0\n2\n0 0\n\n", 4),        # blank entry line
        (b"0\n2\n2 0\n1 5\n", 4),     # epochs out of order
        (b"0\n2\n1 5\n2 4\n", 4),     # start offsets going down
        (b"0\n2\n1 5\n1 6\n", 4),     # repeated epoch
        (b"\xff\xfe\n", None),        # not UTF-8
    ],
)
def test_corrupt_files(tmp_path, content, line):
    path = tmp_path / "leader-epoch-checkpoint"
    path.write_bytes(content)
    with pytest.raises(CorruptFileError) as info:
        LeaderEpochCache.load(path)
    assert info.value.path == str(path)
    assert info.value.line == line
    assert str(path) in str(info.value)


def test_truncated_file_is_corrupt_not_shorter(tmp_path):
    path = tmp_path / "leader-epoch-checkpoint"
    path.write_bytes(format_epoch_checkpoint([(0, 0), (1, 10), (2, 20)]))
    data = path.read_bytes()
    path.write_bytes(data[: data.rindex(b"2 20")])
    with pytest.raises(CorruptFileError):
        read_epoch_checkpoint(path)


def test_failed_write_keeps_old_file_and_entries(tmp_path, monkeypatch):
    path = tmp_path / "leader-epoch-checkpoint"
    cache = LeaderEpochCache(path)
    cache.assign(0, 0)
    old = path.read_bytes()

    def failing_replace(src, dst):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(checkpoints.os, "replace", failing_replace)
    with pytest.raises(KafkaStorageError) as info:
        cache.assign(1, 5)
    assert info.value.path == str(path)
    assert path.read_bytes() == old
    assert cache.entries() == [(0, 0)]
    assert not (tmp_path / "leader-epoch-checkpoint.tmp").exists()


# -- properties ---------------------------------------------------------------

operations = st.lists(
    st.one_of(
        st.tuples(st.just("assign"), st.integers(0, 8), st.integers(0, 40)),
        st.tuples(st.just("end"), st.integers(-1, 45)),
        st.tuples(st.just("start"), st.integers(-1, 45)),
    ),
    max_size=30,
)


@settings(max_examples=150, deadline=None)
@given(operations)
def test_invariants_hold_and_file_matches_memory(tmp_path_factory, ops):
    path = tmp_path_factory.mktemp("epochs") / "leader-epoch-checkpoint"
    cache = LeaderEpochCache(path)
    for op in ops:
        if op[0] == "assign":
            cache.assign(op[1], op[2])
            assert cache.latest_epoch >= 0
        elif op[0] == "end":
            cache.truncate_from_end(op[1])
            if op[1] >= 0:
                assert all(start < op[1] for _, start in cache.entries())
        else:
            cache.truncate_from_start(op[1])
            if op[1] >= 0 and cache.entries():
                assert cache.entries()[0][1] >= op[1]
        entries = cache.entries()
        assert all(a[0] < b[0] and a[1] <= b[1] for a, b in zip(entries, entries[1:], strict=False))
    if path.exists():
        assert read_epoch_checkpoint(path) == cache.entries()


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 5), st.integers(0, 10)), max_size=8,
                unique_by=lambda e: e[0]),
       st.integers(-1, 7), st.integers(0, 30))
def test_end_offset_for_matches_the_table(raw, requested, leo_extra):
    entries = sorted(raw)
    starts = sorted(s for _, s in entries)
    entries = [(e, s) for (e, _), s in zip(entries, starts, strict=True)]
    cache = LeaderEpochCache(None, entries)
    leo = (entries[-1][1] if entries else 0) + leo_extra
    epoch, end_offset = cache.end_offset_for(requested, leo)
    above = [e for e in entries if e[0] > requested]
    at_or_below = [e for e in entries if e[0] <= requested]
    if requested == -1:
        assert (epoch, end_offset) == (-1, -1)
    elif entries and requested == entries[-1][0]:
        assert (epoch, end_offset) == (requested, leo)
    elif not above:
        assert (epoch, end_offset) == (-1, -1)
    elif not at_or_below:
        assert (epoch, end_offset) == (requested, above[0][1])
    else:
        assert (epoch, end_offset) == (at_or_below[-1][0], above[0][1])


# -- the opening's truncation, written lazily (Kafka's truncateFromEndAsyncFlush) ----

def _stored(path):
    return read_epoch_checkpoint(path), os.stat(path).st_ino


def test_truncation_without_write_keeps_the_file_until_assign_makes_it_true_again(tmp_path):
    path = tmp_path / "leader-epoch-checkpoint"
    LeaderEpochCache(path).assign(0, 0)
    cache = LeaderEpochCache.load(path)
    cache.assign(4, 100)
    cache = LeaderEpochCache.load(path)
    before = _stored(path)
    cache.truncate_from_end(100, write=False)
    assert cache.entries() == [(0, 0)] and cache.write_pending
    assert _stored(path) == before  # the file keeps (4, 100)
    cache.assign(4, 100)  # becoming leader again in the same epoch at the same end
    assert cache.entries() == [(0, 0), (4, 100)] and not cache.write_pending
    assert _stored(path) == before  # not rewritten: it already holds exactly this


def test_pending_truncation_is_written_before_the_same_epoch_goes_on(tmp_path):
    path = tmp_path / "leader-epoch-checkpoint"
    LeaderEpochCache(path, [(0, 0)]).assign(4, 100)
    cache = LeaderEpochCache.load(path)
    cache.truncate_from_end(100, write=False)
    cache.assign(0, 150)  # no change in memory, but the file must lose (4, 100)
    assert read_epoch_checkpoint(path) == [(0, 0)] and not cache.write_pending
    cache.truncate_from_end(0, write=False)
    cache.write_if_pending()
    assert read_epoch_checkpoint(path) == [] == cache.entries()


def test_any_change_after_a_pending_truncation_writes_memory(tmp_path):
    path = tmp_path / "leader-epoch-checkpoint"
    LeaderEpochCache(path, [(0, 0)]).assign(4, 100)
    cache = LeaderEpochCache.load(path)
    cache.truncate_from_end(100, write=False)
    cache.assign(5, 120)
    assert read_epoch_checkpoint(path) == [(0, 0), (5, 120)] == cache.entries()


def test_a_missing_file_is_written_even_for_no_entries(tmp_path):
    path = tmp_path / "leader-epoch-checkpoint"
    LeaderEpochCache.load(path).clear()
    assert path.exists() and read_epoch_checkpoint(path) == []
