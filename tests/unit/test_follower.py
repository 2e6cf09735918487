"""Follower truncation (OffsetForLeaderEpoch, diverging_epoch), follower HW, leader divergence check.

Every worked example of the replication reference and the design notes in
/work/shared/seeds is here, driven through the same LeaderEpochCache the
broker uses (in memory).
"""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tidewater.broker.replication.follower import (
    FetchedCut,
    TruncationStep,
    check_diverging,
    fetched_from_log_end,
    follower_truncation,
    truncation_for_diverging_epoch,
)
from tidewater.broker.storage.epoch_cache import LeaderEpochCache
from tidewater.proto.errors import OffsetOutOfRangeError


def cache(*entries):
    return LeaderEpochCache(None, entries)


def negotiate(leader_cache, leader_leo, follower_cache, follower_leo, follower_hw, max_rounds=10):
    """Run the OffsetForLeaderEpoch loop as a follower would; returns (final offset, rounds)."""
    for rounds in range(1, max_rounds + 1):
        answer = leader_cache.end_offset_for(follower_cache.latest_epoch, leader_leo)
        step = follower_truncation(answer, follower_cache, follower_leo, follower_hw)
        assert step.truncate_to <= follower_leo
        follower_leo = step.truncate_to
        follower_cache.truncate_from_end(step.truncate_to)
        follower_hw = min(follower_hw, follower_leo)
        if step.done:
            return follower_leo, rounds
    raise AssertionError("truncation did not converge")


def test_reference_worked_example():
    # Leader (0,0),(2,5) LEO 8; follower (0,0),(1,3) LEO 6. Follower asks with
    # epoch 1, leader answers (0,5); follower's end_offset_for(0) is (0,3).
    leader, follower = cache((0, 0), (2, 5)), cache((0, 0), (1, 3))
    answer = leader.end_offset_for(1, 8)
    assert answer == (0, 5)
    assert follower_truncation(answer, follower, 6, 2) == TruncationStep(3, done=True)


def test_undefined_answer_falls_back_to_high_watermark():
    follower = cache((0, 0), (1, 3))
    assert follower_truncation((-1, -1), follower, 6, 2) == TruncationStep(2, done=True)
    # The leader knows no epoch for a follower with an empty cache either.
    assert follower_truncation(cache().end_offset_for(-1, 9), cache(), 4, 1) == TruncationStep(1, True)


def test_same_epoch_follower_behind_truncates_nothing():
    # Leader and follower in epoch 3; the leader has more (LEO 20 vs 12).
    leader, follower = cache((0, 0), (3, 7)), cache((0, 0), (3, 7))
    answer = leader.end_offset_for(3, 20)
    assert answer == (3, 20)
    assert follower_truncation(answer, follower, 12, 9) == TruncationStep(12, done=True)


def test_follower_ahead_in_same_epoch_cuts_to_leader_end():
    # The follower had epoch-3 records the new leader (epoch 4) never got.
    leader, follower = cache((0, 0), (3, 7), (4, 10)), cache((0, 0), (3, 7))
    answer = leader.end_offset_for(3, 15)
    assert answer == (3, 10)
    assert follower_truncation(answer, follower, 13, 8) == TruncationStep(10, done=True)


def test_epochs_disagree_ask_again_until_they_match():
    # Leader (0,0),(1,5),(3,10) LEO 12; follower (0,0),(2,6) LEO 9 (it led epoch 2
    # without the leader's epoch 1). Round 1: leader answers (1,10) for epoch 2;
    # follower never had epoch 1: end_offset_for(1) = (0,6) -> truncate to 6, ask again.
    leader, follower = cache((0, 0), (1, 5), (3, 10)), cache((0, 0), (2, 6))
    first = leader.end_offset_for(2, 12)
    assert first == (1, 10)
    assert follower_truncation(first, follower, 9, 3) == TruncationStep(6, done=False)
    follower.truncate_from_end(6)
    # Round 2 with epoch 0: leader (0,5), own (0,6) -> truncate to 5.
    second = leader.end_offset_for(follower.latest_epoch, 12)
    assert second == (0, 5)
    assert follower_truncation(second, follower, 6, 3) == TruncationStep(5, done=True)


def test_negotiate_loop_converges_on_common_prefix():
    final, rounds = negotiate(cache((0, 0), (1, 5), (3, 10)), 12, cache((0, 0), (2, 6)), 9, 3)
    assert (final, rounds) == (5, 2)


def test_follower_without_epoch_information_takes_leader_offset():
    # Follower's cache is empty (e.g. data from before epochs were tracked):
    # Kafka's fallback truncates to the leader's offset.
    assert follower_truncation((2, 7), cache(), 9, 3) == TruncationStep(7, done=True)
    assert follower_truncation((2, 7), cache(), 5, 3) == TruncationStep(5, done=True)


def test_seed_notes_old_leader_rejoins_after_new_epoch():
    # 000 notes: A (old leader) has offsets 1..6 in epoch 1 (LEO 7); B led epoch 2
    # from offset 5 (LEO 8). A asks with epoch 1, B answers (1,5): A drops 5 and 6.
    leader, follower = cache((1, 1), (2, 5)), cache((1, 1))
    answer = leader.end_offset_for(1, 8)
    assert answer == (1, 5)
    assert follower_truncation(answer, follower, 7, 4) == TruncationStep(5, done=True)


def test_seed_notes_kip101_data_loss_scenario_keeps_m2():
    # 004 scenario 1: follower A has m1, m2 (epoch 0, LEO 2) with HW 1 when it
    # restarts; leader B has the same. Truncating to the HW would lose m2.
    leader, follower = cache((0, 0)), cache((0, 0))
    answer = leader.end_offset_for(0, 2)
    assert answer == (0, 2)
    assert follower_truncation(answer, follower, 2, 1) == TruncationStep(2, done=True)


def test_seed_notes_divergent_logs_scenario_drops_m2():
    # 002/004 scenario 2: A has m1, m2 in epoch 0; both crash, B (only m1) leads
    # epoch 1 and writes m3 at offset 1. A asks with 0, B answers (0,1): drop m2.
    leader, follower = cache((0, 0), (1, 1)), cache((0, 0))
    answer = leader.end_offset_for(0, 2)
    assert answer == (0, 1)
    assert follower_truncation(answer, follower, 2, 1) == TruncationStep(1, done=True)


def test_truncation_never_extends_the_log():
    leader, follower = cache((0, 0), (5, 50)), cache((0, 0), (5, 50))
    assert follower_truncation(leader.end_offset_for(5, 80), follower, 60, 55).truncate_to == 60


# ---------------------------------------------------------------- diverging epoch (KIP-320)

def test_check_diverging_no_epoch_means_no_check():
    assert check_diverging(-1, 5, cache((0, 0), (2, 5)), 8) is None


def test_check_diverging_consistent_fetch_is_served():
    leader = cache((0, 0), (2, 5))
    assert check_diverging(2, 8, leader, 8) is None  # latest epoch, at the LEO
    assert check_diverging(0, 5, leader, 8) is None  # epoch 0 ended at 5, fetching from 5


def test_check_diverging_fetch_offset_past_epoch_end():
    # The follower fetched epoch 0 up to 6 but the leader's epoch 0 ended at 5.
    assert check_diverging(0, 6, cache((0, 0), (2, 5)), 8) == (0, 5)


def test_check_diverging_leader_never_had_the_epoch():
    # Reference worked example via a fetch: last fetched epoch 1, offset 6.
    leader, follower = cache((0, 0), (2, 5)), cache((0, 0), (1, 3))
    diverging = check_diverging(1, 6, leader, 8)
    assert diverging == (0, 5)
    assert truncation_for_diverging_epoch(diverging, follower, 6, 2) == TruncationStep(3, True)


def test_check_diverging_unplaceable_epoch_is_out_of_range():
    # Epoch 3 is above everything the leader has and not its latest.
    with pytest.raises(OffsetOutOfRangeError):
        check_diverging(3, 4, cache((0, 0), (2, 100)), 100)


def test_check_diverging_epoch_before_leader_history():
    # Leader's cache starts at epoch 4 (older entries retained away); follower says 2.
    leader = cache((4, 50), (6, 70))
    assert check_diverging(2, 60, leader, 80) == (2, 50)  # ended before 60: diverging
    assert check_diverging(2, 50, leader, 80) is None



# ---------------------------------------------------------------- a fetched chunk

def batches_of(*offsets):
    """Contiguous batches ``(position, base, next)``, 100 bytes each, from (base, next)."""
    return [(100 * i, base, next_) for i, (base, next_) in enumerate(offsets)]


def test_fetched_chunk_from_the_log_end_is_appended_whole():
    assert fetched_from_log_end(batches_of((5, 8), (8, 10)), 5) == FetchedCut(None, 0)


def test_fetched_batches_below_the_log_end_are_skipped():
    cut = fetched_from_log_end(batches_of((0, 3), (3, 5), (5, 9)), 5)
    assert cut == FetchedCut(None, 200)
    assert cut.append_from(5) == 200


def test_a_fetched_batch_straddling_the_log_end_cuts_our_log_to_its_base():
    cut = fetched_from_log_end(batches_of((0, 3), (3, 7), (7, 9)), 5)
    assert cut == FetchedCut(truncate_to=3, start_position=100)
    assert cut.append_from(3) == 100  # our log ends exactly at its base: take the leader's
    # Our own batch straddles 3 as well: the cut went below it; fetch again from there.
    assert cut.append_from(2) is None


def test_nothing_past_the_log_end_appends_nothing():
    assert fetched_from_log_end([], 4) == FetchedCut(None, None)
    assert fetched_from_log_end(batches_of((0, 2), (2, 4)), 4) == FetchedCut(None, None)
    assert FetchedCut(None, None).append_from(4) is None


def test_a_compacted_gap_after_the_log_end_is_appended():
    # A compacted leader's batches may start past our LEO (their first offsets were cleaned).
    assert fetched_from_log_end(batches_of((0, 3), (6, 9)), 4) == FetchedCut(None, 100)


@st.composite
def chunks(draw):
    """Batches as a leader sends them (from some base, with compacted gaps sometimes)
    and a follower LEO anywhere around them."""
    offset = draw(st.integers(0, 20))
    position, batches = 0, []
    for _ in range(draw(st.integers(0, 8))):
        offset += draw(st.sampled_from([0, 0, 0, 2]))  # a gap left by compaction
        count = draw(st.integers(1, 5))
        batches.append((position, offset, offset + count))
        position += draw(st.integers(61, 200))
        offset += count
    return batches, draw(st.integers(0, offset + 3))


@given(chunks())
@settings(max_examples=500)
def test_fetched_cut_properties(chunk):
    batches, log_end_offset = chunk
    cut = fetched_from_log_end(iter(batches), log_end_offset)  # any iterable, read once
    past = [b for b in batches if b[2] > log_end_offset]
    if not past:
        assert cut == FetchedCut(None, None)
        return
    position, base_offset, _ = past[0]
    # Appended from the first batch past our LEO; everything before it we hold already.
    assert cut.start_position == position
    assert all(b[2] <= log_end_offset for b in batches if b[0] < position)
    # A cut only for a straddling batch, to its base, below our LEO.
    if base_offset < log_end_offset:
        assert cut.truncate_to == base_offset
        assert cut.append_from(base_offset) == position
        assert cut.append_from(base_offset - 1) is None
    else:
        assert cut.truncate_to is None
        assert cut.append_from(log_end_offset) == position
