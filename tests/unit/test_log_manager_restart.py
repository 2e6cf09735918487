"""LogManager start-up after a crash: logs recovered several at a time come out as one
thread recovers them, a corrupt partition.metadata stops the load before any log is
cut, and an index file a re-validated segment rebuilds identically is kept (fsynced,
not cut and rewritten) while the segment's .log is fsynced before the recovery point
passes it."""

import os
import shutil

import pytest

from tidewater.broker.storage.checkpoints import CLEAN_SHUTDOWN_FILE
from tidewater.broker.storage.log_config import LogConfig
from tidewater.broker.storage.log_manager import LogManager
from tidewater.broker.storage.partition_metadata import PARTITION_METADATA_FILE
from tidewater.broker.storage.topics import TopicPartition
from tidewater.proto.errors import CorruptFileError
from tidewater.proto.records import encode_batch

pytestmark = pytest.mark.timeout(120)

CONFIG = LogConfig(segment_bytes=4096, index_interval_bytes=200)
LOGS = [TopicPartition(f"t{i:02d}", 0) for i in range(12)]


def batch(n=3):
    return encode_batch([(None, b"v" * 40)] * n, base_timestamp_ms=1000)


def crashed_data_dir(path, *, topic_ids=False):
    """Logs written, flushed, then more appended without a flush: a process killed with
    the page cache intact. Returns each log's end offset and the path of its last .log."""
    manager = LogManager(path, CONFIG)
    manager.load(now_ms=0)
    ends = {}
    for n, tp in enumerate(LOGS):
        log = manager.get_or_create(tp, CONFIG, now_ms=0,
                                    topic_id=bytes([n + 1]) * 16 if topic_ids else None)
        for _ in range(5 + 3 * n):
            log.append_as_leader(batch(), leader_epoch=1, now_ms=0)
        log.flush()
        log.append_as_leader(batch(), leader_epoch=2, now_ms=0)
        ends[tp] = log.log_end_offset
    manager.checkpoint_recovery_points(flush=False)
    assert not (path / CLEAN_SHUTDOWN_FILE).exists()  # no shutdown: "killed"
    return ends


def last_log_file(directory):
    return sorted(directory.glob("*.log"))[-1]


def tear(directory, garbage=b"\x00\x00\x00\x00\x00\x00\x00\x09torn-batch"):
    with open(last_log_file(directory), "ab") as f:
        f.write(garbage)


def files_of(data_dir):
    return {p.relative_to(data_dir).as_posix(): p.read_bytes()
            for p in sorted(data_dir.rglob("*"))
            if p.is_file() and p.suffix in (".log", ".index", ".timeindex")}


def test_logs_recovered_four_at_a_time_come_out_as_with_one_thread(tmp_path):
    ends = crashed_data_dir(tmp_path / "a")
    for tp in LOGS[::3]:
        tear(tmp_path / "a" / f"{tp.topic}-0")
    shutil.copytree(tmp_path / "a", tmp_path / "b")

    results = {}
    for name, threads in (("a", 1), ("b", 4)):
        manager = LogManager(tmp_path / name, CONFIG, recovery_threads=threads)
        manager.load(now_ms=0)
        assert not manager.had_clean_shutdown
        results[name] = {tp: (log.log_end_offset, log.leader_epoch_cache.entries())
                         for tp, log in manager.logs().items()}
        manager.shutdown()
    assert results["a"] == results["b"]
    assert {tp: end for tp, (end, _) in results["b"].items()} == ends  # torn tails cut
    assert files_of(tmp_path / "a") == files_of(tmp_path / "b")


def test_a_corrupt_partition_metadata_stops_the_load_before_any_log_is_cut(tmp_path):
    crashed_data_dir(tmp_path, topic_ids=True)
    torn = tmp_path / f"{LOGS[0].topic}-0"  # sorts before the corrupt one
    tear(torn)
    size = last_log_file(torn).stat().st_size
    (tmp_path / f"{LOGS[-1].topic}-0" / PARTITION_METADATA_FILE).write_text("version: 0\nnot it\n")

    manager = LogManager(tmp_path, CONFIG, recovery_threads=4)
    with pytest.raises(CorruptFileError, match="partition.metadata"):
        manager.load(now_ms=0)
    assert manager.logs() == {}
    assert last_log_file(torn).stat().st_size == size  # nothing recovered, nothing cut


def _record_syncs(monkeypatch):
    synced = []
    real_fsync, real_fdatasync = os.fsync, os.fdatasync

    def fsync(fd):
        synced.append(os.readlink(f"/proc/self/fd/{fd}"))
        real_fsync(fd)

    def fdatasync(fd):
        synced.append(os.readlink(f"/proc/self/fd/{fd}"))
        real_fdatasync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "fdatasync", fdatasync)
    return synced


@pytest.mark.parametrize("threads", [1, 4])
def test_index_files_rebuilt_identically_are_kept_and_every_scanned_file_fsynced(
        tmp_path, monkeypatch, threads):
    crashed_data_dir(tmp_path)
    # A clean close wrote every index file; the marker's removal makes the start unclean,
    # so every segment is re-validated (recovery points checkpointed below the ends).
    manager = LogManager(tmp_path, CONFIG)
    manager.load(now_ms=0)
    manager.shutdown()
    (tmp_path / CLEAN_SHUTDOWN_FILE).unlink()
    (tmp_path / "recovery-point-offset-checkpoint").unlink()
    damaged = max((tmp_path / f"{LOGS[5].topic}-0").glob("*.index"),
                  key=lambda p: p.stat().st_size)
    good = damaged.read_bytes()
    assert len(good) >= 16, "the test needs an index with two entries or more"
    damaged.write_bytes(good[:-8])  # one entry short: sane, but not what a rebuild makes
    indexes = sorted(tmp_path.rglob("*.index")) + sorted(tmp_path.rglob("*.timeindex"))
    before = {p: (p.stat().st_ino, p.stat().st_mtime_ns) for p in indexes}
    synced = _record_syncs(monkeypatch)

    again = LogManager(tmp_path, CONFIG, recovery_threads=threads)
    again.load(now_ms=0)
    assert not again.had_clean_shutdown
    rewritten = [p for p in indexes if (p.stat().st_ino, p.stat().st_mtime_ns) != before[p]]
    # Every offset index but the damaged one is kept; a time index whose closing entry
    # (written when its segment became inactive) a rebuild does not make is rewritten.
    assert [p for p in rewritten if p.suffix == ".index"] == [damaged]
    assert len(rewritten) < len(indexes) // 4
    assert damaged.read_bytes() == good
    scanned = {str(p) for p in tmp_path.rglob("*")
               if p.suffix in (".log", ".index", ".timeindex") and p.stat().st_size}
    assert scanned <= set(synced)  # nothing passes the recovery point unsynced
    again.shutdown()


def test_recovery_threads_is_a_broker_setting(tmp_path):
    from tidewater.broker.config import ConfigError, config_from_args

    base = ["--broker-id", "1", "--listen", "127.0.0.1:1", "--data-dir", str(tmp_path),
            "--controller", "127.0.0.1:2"]
    assert config_from_args(base).num_recovery_threads_per_data_dir == 4
    config = config_from_args([*base, "--set", "num.recovery.threads.per.data.dir=1"])
    assert config.num_recovery_threads_per_data_dir == 1
    with pytest.raises(ConfigError, match="num.recovery.threads.per.data.dir must be positive"):
        config_from_args([*base, "--set", "num.recovery.threads.per.data.dir=0"])
