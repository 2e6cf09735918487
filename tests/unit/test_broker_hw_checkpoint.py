"""broker/replicas/hw_checkpoint.py: the HWs read at start-up and the ones checkpointed."""

from dataclasses import dataclass

from tidewater.broker.replicas.hw_checkpoint import (
    high_watermarks_to_checkpoint,
    loaded_high_watermarks,
)


@dataclass
class Bounds:
    log_start_offset: int
    log_end_offset: int


def test_loaded_hw_is_clamped_to_the_log():
    logs = {"lost-tail": Bounds(0, 5), "retention-moved": Bounds(40, 90), "fine": Bounds(0, 9),
            "unlisted": Bounds(3, 7)}
    checkpointed = {"lost-tail": 8, "retention-moved": 10, "fine": 6, "no-log": 4}
    assert loaded_high_watermarks(checkpointed, logs) == {
        "lost-tail": 5, "retention-moved": 40, "fine": 6, "unlisted": 3}


def test_checkpoint_keeps_unclaimed_logs_and_takes_the_partitions_hws():
    loaded = {"unclaimed": 7, "claimed": 3}
    assert high_watermarks_to_checkpoint(loaded, {"claimed": 9, "new": 2}) == {
        "unclaimed": 7, "claimed": 9, "new": 2}
