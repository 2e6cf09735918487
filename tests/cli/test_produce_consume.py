"""`tide produce` / `tide consume` round trips against a real controller and 3 brokers."""

from __future__ import annotations

import json
import time

import pytest
from cluster_fixtures import assert_one_line_error, cluster, run_tide  # noqa: F401

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def topic(cluster):  # noqa: F811
    name = "rt"
    result = cluster.tide("topics", "create", name, "--partitions", "3", "--replication-factor", "3",
                          "--config", "min.insync.replicas=2")
    assert result.returncode == 0, result.stderr
    deadline = time.monotonic() + 15
    while True:
        info = json.loads(cluster.tide("topics", "describe", name, "--json").stdout)["topics"][0]
        if all(p["leader"] >= 0 and len(p["isr"]) == 3 for p in info["partitions"]):
            return name
        assert time.monotonic() < deadline, info
        time.sleep(0.2)


def read_ack_log(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_keyed_round_trip_with_acks_all_and_ack_log(cluster, topic, tmp_path):  # noqa: F811
    lines = [f"user-{i % 7}:event-{i}" for i in range(300)]
    ack_log = tmp_path / "acks.jsonl"
    # Small batches: each request carries several batches per partition.
    result = cluster.tide("produce", topic, "--acks", "all", "--key-separator", ":",
                          "--batch-size", "256", "--linger-ms", "20",
                          "--ack-log", str(ack_log), input="\n".join(lines) + "\n")
    assert result.returncode == 0, result.stderr
    acks = read_ack_log(ack_log)
    assert len(acks) == 300
    assert {a["acks"] for a in acks} == {"all"} and {a["topic"] for a in acks} == {topic}
    assert sorted(f"{a['key']}:{a['value']}" for a in acks) == sorted(lines)
    # One key always lands on one partition; offsets within a partition are distinct and dense.
    by_key = {}
    for a in acks:
        by_key.setdefault(a["key"], set()).add(a["partition"])
    assert all(len(parts) == 1 for parts in by_key.values())
    for p in {a["partition"] for a in acks}:
        offsets = sorted(a["offset"] for a in acks if a["partition"] == p)
        assert offsets == list(range(offsets[0], offsets[0] + len(offsets)))

    consumed = cluster.tide("consume", topic, "--from-beginning", "--json", "--timeout-ms", "2000")
    assert consumed.returncode == 0, consumed.stderr
    records = [json.loads(line) for line in consumed.stdout.splitlines()]
    got = {(r["partition"], r["offset"]): r for r in records}
    for a in acks:
        r = got[(a["partition"], a["offset"])]
        assert (r["key"], r["value"]) == (a["key"], a["value"])
        assert r["topic"] == topic and r["leader_epoch"] >= 0 and r["timestamp"] > 0
        assert r["headers"] == []
    assert len(records) == len(got)  # no record twice


def test_consume_one_partition_from_offset_with_max_messages(cluster, topic):  # noqa: F811
    result = cluster.tide("produce", topic, "--partition", "1", "--acks", "1", "--compression", "zstd",
                          input="".join(f"p1-{i}\n" for i in range(20)))
    assert result.returncode == 0, result.stderr
    records = [json.loads(line) for line in cluster.tide(
        "consume", topic, "--partition", "1", "--from-beginning", "--json", "--timeout-ms", "1500").stdout.splitlines()]
    ours = [r for r in records if r["value"].startswith("p1-")]
    assert [r["value"] for r in ours] == [f"p1-{i}" for i in range(20)]
    start = ours[5]["offset"]
    plain = cluster.tide("consume", topic, "--partition", "1", "--offset", str(start),
                         "--max-messages", "3", "--timeout-ms", "5000")
    assert plain.returncode == 0, plain.stderr
    assert plain.stdout.splitlines() == ["p1-5", "p1-6", "p1-7"]
    keyed = cluster.tide("consume", topic, "--partition", "1", "--offset", str(start),
                         "--max-messages", "1", "--print-key", "--key-separator", "=")
    assert keyed.stdout == "=p1-5\n"  # no key: empty before the separator


def test_acks_zero_and_one(cluster, topic, tmp_path):  # noqa: F811
    for acks in ("0", "1"):
        log = tmp_path / f"acks{acks}.jsonl"
        result = cluster.tide("produce", topic, "--acks", acks, "--partition", "2", "--ack-log", str(log),
                              input="a\nb\n")
        assert result.returncode == 0, result.stderr
        entries = read_ack_log(log)
        assert [e["value"] for e in entries] == ["a", "b"] and {e["acks"] for e in entries} == {acks}
        if acks == "1":
            assert entries[1]["offset"] == entries[0]["offset"] + 1
        else:
            assert {e["offset"] for e in entries} == {-1}


def test_default_consume_starts_at_end(cluster, topic):  # noqa: F811
    result = cluster.tide("consume", topic, "--timeout-ms", "800")
    assert result.returncode == 0 and result.stdout == ""


def test_unknown_topic(cluster):  # noqa: F811
    assert_one_line_error(cluster.tide("produce", "no-such-topic", input="x\n"),
                          "no-such-topic", "UNKNOWN_TOPIC_OR_PARTITION")
    assert_one_line_error(cluster.tide("consume", "no-such-topic", "--timeout-ms", "500"),
                          "no-such-topic", "UNKNOWN_TOPIC_OR_PARTITION")


def test_line_without_key_separator_is_a_counted_failure(cluster, topic, tmp_path):  # noqa: F811
    log = tmp_path / "acks.jsonl"
    result = cluster.tide("produce", topic, "--key-separator", ":", "--ack-log", str(log),
                          input="k:v1\nnokey\nk:v2\n")
    line = assert_one_line_error(result, "1 of 3 records failed", "line 2")
    assert "separator" in line
    assert [e["value"] for e in read_ack_log(log)] == ["v1", "v2"]


@pytest.mark.parametrize("ack_log", [False, True])
def test_records_the_broker_refuses_are_counted_with_or_without_an_ack_log(
        cluster, tmp_path, ack_log):  # noqa: F811
    """Without an ack log no callback runs per record: the producer's own failure count
    must still reach the exit status and the message."""
    name = f"small-{int(ack_log)}"
    assert cluster.tide("topics", "create", name, "--partitions", "1", "--replication-factor",
                        "3", "--config", "max.message.bytes=1024").returncode == 0
    log = ["--ack-log", str(tmp_path / "acks.jsonl")] if ack_log else []
    # every 4 KiB line is over the topic's limit, however the lines are batched
    result = cluster.tide("produce", name, *log, input=("x" * 4096 + "\n") * 3)
    line = assert_one_line_error(result, "3 of 3 records failed")
    assert "TOO_LARGE" in line


def test_bad_partition(cluster, topic):  # noqa: F811
    assert_one_line_error(cluster.tide("produce", topic, "--partition", "9", input="x\n"), "partition 9")
    assert_one_line_error(cluster.tide("consume", topic, "--partition", "9", "--timeout-ms", "300"),
                          "partition 9")


def test_unreachable_bootstrap_fails_with_one_line():
    from tidewater.tools.local_cluster import free_port

    address = f"127.0.0.1:{free_port()}"
    result = run_tide("topics", "list", bootstrap=address, timeout_s=30)
    assert_one_line_error(result, "no broker reachable", address)
    result = run_tide("produce", "t", bootstrap=address, input="x\n", timeout_s=30)
    assert_one_line_error(result, "no broker reachable")
    # The environment variable works as --bootstrap-server does.
    result = run_tide("consume", "t", "--timeout-ms", "300", env={"TIDE_BOOTSTRAP_SERVER": address},
                      timeout_s=30)
    assert_one_line_error(result, "no broker reachable", address)


def test_bad_bootstrap_value():
    assert_one_line_error(run_tide("topics", "list", bootstrap="nohostport"), "--bootstrap-server")


def test_zz_leader_killed_acknowledged_records_survive(cluster, topic, tmp_path):  # noqa: F811
    """Last in the module: SIGKILL partition 0's leader, keep producing with acks=all through the
    CLI (the producer retries on the new leader), then every acknowledged record is readable at
    the offset it was acknowledged with."""
    d = str(cluster.data_dir)
    info = json.loads(cluster.tide("topics", "describe", topic, "--json").stdout)["topics"][0]
    leader = info["partitions"][0]["leader"]
    epoch = info["partitions"][0]["leader_epoch"]
    assert cluster.tide("cluster", "kill", str(leader), "--data-dir", d).returncode == 0
    try:
        ack_log = tmp_path / "acks.jsonl"
        result = cluster.tide("produce", topic, "--partition", "0", "--acks", "all", "--ack-log", str(ack_log),
                              "--timeout-ms", "30000", input="".join(f"after-kill-{i}\n" for i in range(200)))
        assert result.returncode == 0, result.stderr
        acks = read_ack_log(ack_log)
        assert sorted(a["value"] for a in acks) == sorted(f"after-kill-{i}" for i in range(200))
        info = json.loads(cluster.tide("topics", "describe", topic, "--json").stdout)["topics"][0]
        p0 = info["partitions"][0]
        assert p0["leader"] != leader and p0["leader_epoch"] > epoch and leader not in p0["isr"]
        consumed = cluster.tide("consume", topic, "--partition", "0", "--from-beginning", "--json",
                                "--timeout-ms", "2000")
        assert consumed.returncode == 0, consumed.stderr
        got = {r["offset"]: r for r in map(json.loads, consumed.stdout.splitlines())}
        for a in acks:
            assert got[a["offset"]]["value"] == a["value"]
            assert got[a["offset"]]["leader_epoch"] == p0["leader_epoch"]
    finally:
        started = cluster.tide("cluster", "start", str(leader), "--data-dir", d, timeout_s=90)
        assert started.returncode == 0, started.stderr
