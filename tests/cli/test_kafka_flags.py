"""Issue 15: `tide` with Kafka's console-tool flags, as a Kafka user types them, against a
real controller and 3 brokers; and what `tide cluster up` tells a new user."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest
from cluster_fixtures import PROJECT_DIR, assert_one_line_error, cluster, run_tide  # noqa: F401

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]


def wait_for_full_isr(cluster, name):  # noqa: F811
    deadline = time.monotonic() + 15
    while True:
        info = json.loads(cluster.tide("topics", "describe", name, "--json").stdout)["topics"][0]
        if all(p["leader"] >= 0 and len(p["isr"]) == len(p["replicas"]) for p in info["partitions"]):
            return info
        assert time.monotonic() < deadline, info
        time.sleep(0.2)


def test_topics_with_topic_flag_and_bootstrap_after_the_command(cluster):  # noqa: F811
    where = ["--bootstrap-server", cluster.bootstrap]
    created = run_tide("topics", "create", "--topic", "kf-orders", "--partitions", "2",
                       "--replication-factor", "3", *where)
    assert created.returncode == 0, created.stderr
    assert created.stdout == "Created topic kf-orders.\n"
    info = wait_for_full_isr(cluster, "kf-orders")
    assert len(info["partitions"]) == 2
    described = run_tide("topics", "describe", "--topic", "kf-orders", *where)
    assert described.returncode == 0, described.stderr
    assert described.stdout.startswith("Topic: kf-orders\t") and "Partition: 1" in described.stdout
    deleted = run_tide("topics", "delete", "--topic", "kf-orders", *where)
    assert deleted.returncode == 0, deleted.stderr
    assert deleted.stdout == "Deleted topic kf-orders.\n"


def test_topic_given_two_different_ways_is_refused(cluster):  # noqa: F811
    result = cluster.tide("topics", "create", "kf-a", "--topic", "kf-b")
    assert result.returncode == 2
    assert_one_line_error(result, "'kf-a' and 'kf-b'")
    assert not {"kf-a", "kf-b"} & set(cluster.tide("topics", "list").stdout.split())


def test_kafka_style_produce_and_consume_with_keys(cluster, tmp_path):  # noqa: F811
    assert cluster.tide("topics", "create", "kf-keys", "--partitions", "1", "--replication-factor", "3").returncode == 0
    wait_for_full_isr(cluster, "kf-keys")
    ack_log = tmp_path / "acks.jsonl"
    produced = cluster.tide("produce", "--topic", "kf-keys", "--property", "parse.key=true",
                            "--property", "key.separator=:", "--producer-property", "acks=all",
                            "--ack-log", str(ack_log), input="k1:v1\nk2:v2:with-colon\nk3:v3\n")
    assert produced.returncode == 0, produced.stderr
    acks = [json.loads(line) for line in ack_log.read_text().splitlines()]
    assert [(a["key"], a["value"], a["acks"]) for a in acks] == [
        ("k1", "v1", "all"), ("k2", "v2:with-colon", "all"), ("k3", "v3", "all")]
    # Kafka's console consumer: print.key=true prints KEY<TAB>VALUE; --max-messages stops it.
    consumed = cluster.tide("consume", "--topic", "kf-keys", "--from-beginning", "--property", "print.key=true",
                            "--max-messages", "2", "--timeout-ms", "10000")
    assert consumed.returncode == 0, consumed.stderr
    assert consumed.stdout == "k1\tv1\nk2\tv2:with-colon\n"
    # parse.key=true alone splits at a tab, Kafka's default separator.
    tabbed = cluster.tide("produce", "--topic", "kf-keys", "--property", "parse.key=true", input="k4\tv4\n")
    assert tabbed.returncode == 0, tabbed.stderr
    last = cluster.tide("consume", "kf-keys", "--partition", "0", "--offset", "3", "--property", "print.key=true",
                        "--property", "key.separator=|", "--max-messages", "1", "--timeout-ms", "10000")
    assert last.returncode == 0, last.stderr
    assert last.stdout == "k4|v4\n"


def test_offset_words_and_numbers(cluster):  # noqa: F811
    assert cluster.tide("topics", "create", "kf-offsets", "--replication-factor", "3").returncode == 0
    wait_for_full_isr(cluster, "kf-offsets")
    produced = cluster.tide("produce", "kf-offsets", input="".join(f"r{i}\n" for i in range(5)))
    assert produced.returncode == 0, produced.stderr
    earliest = cluster.tide("consume", "kf-offsets", "--partition", "0", "--offset", "earliest",
                            "--max-messages", "2", "--timeout-ms", "10000")
    assert earliest.stdout == "r0\nr1\n", earliest.stderr
    middle = cluster.tide("consume", "kf-offsets", "--partition", "0", "--offset", "3", "--timeout-ms", "1500")
    assert middle.stdout == "r3\nr4\n" and middle.stderr == "", middle.stderr
    latest = cluster.tide("consume", "kf-offsets", "--partition", "0", "--offset", "latest", "--timeout-ms", "800")
    assert latest.returncode == 0 and latest.stdout == ""
    assert_one_line_error(cluster.tide("consume", "kf-offsets", "--offset", "3", "--timeout-ms", "300"),
                          "--offset needs --partition")


def test_offset_past_the_end_starts_at_the_end(cluster):  # noqa: F811
    """Issue 15: `--offset N` past the end rewound to 0 and printed the whole partition.
    Kafka's console consumer starts at the end instead, and so does tide, saying so."""
    assert cluster.tide("topics", "create", "kf-past", "--replication-factor", "3").returncode == 0
    wait_for_full_isr(cluster, "kf-past")
    assert cluster.tide("produce", "kf-past", input="old-0\nold-1\nold-2\n").returncode == 0
    proc = subprocess.Popen(
        [sys.executable, "-m", "tidewater.tools", "--bootstrap-server", cluster.bootstrap, "consume", "kf-past",
         "--partition", "0", "--offset", "1000", "--max-messages", "1", "--timeout-ms", "20000"],
        cwd=PROJECT_DIR, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        # The note is written once the consumer's position is the end: produce after it.
        note = proc.stderr.readline()
        assert note.startswith("tide: note: offset 1000 is not in kf-past-0"), note
        assert "end 3" in note and "starting at the end, 3" in note
        assert cluster.tide("produce", "kf-past", input="new-3\n").returncode == 0
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, err
    assert out == "new-3\n"


def test_argument_errors_show_the_subcommands_usage():
    result = run_tide("consume", "t", "--no-such-flag")
    assert result.returncode == 2
    assert result.stderr.startswith("usage: tide consume"), result.stderr
    assert result.stderr_lines[-1] == "tide consume: error: unrecognized arguments: --no-such-flag"


def test_cluster_up_prints_exports_and_restarts_an_existing_cluster(tmp_path):
    data = tmp_path / "c"
    up = ["cluster", "up", "--brokers", "1", "--data-dir", str(data), "--base-port", "0", "--ready-timeout-s", "60",
          "--controllers", "1"]
    try:
        first = run_tide(*up, timeout_s=120)
        assert first.returncode == 0, first.stderr
        bootstrap = first.stdout.strip().splitlines()[-1]
        assert first.stdout == bootstrap + "\n"  # stdout is only the address, for scripts
        manifest = json.loads((data / "cluster.json").read_text())
        assert f"export TIDE_BOOTSTRAP_SERVER={bootstrap}" in first.stderr_lines
        assert any(line.startswith(f"export TIDE_KAFKA_BOOTSTRAP={manifest['kafka_bootstrap']}")
                   for line in first.stderr_lines)
        assert "restarted" not in first.stderr
        # A brand-new data dir was never shut down, cleanly or not.
        assert "not shut down cleanly" not in (data / "broker-1.log").read_text()
        assert run_tide("topics", "create", "kept", bootstrap=bootstrap).returncode == 0
        assert run_tide("produce", "kept", input="still here\n", bootstrap=bootstrap).returncode == 0

        assert run_tide("cluster", "down", "--data-dir", str(data), timeout_s=60).returncode == 0
        again = run_tide(*up, timeout_s=120)
        assert again.returncode == 0, again.stderr
        assert f"# restarted the cluster in {data.resolve()}: its topics and records are kept" in again.stderr_lines
        bootstrap = again.stdout.strip().splitlines()[-1]
        assert f"export TIDE_BOOTSTRAP_SERVER={bootstrap}" in again.stderr_lines
        read = run_tide("consume", "kept", "--from-beginning", "--max-messages", "1", "--timeout-ms", "20000",
                        bootstrap=bootstrap)
        assert read.stdout == "still here\n", read.stderr
    finally:
        run_tide("cluster", "down", "--data-dir", str(data), "--timeout-s", "10", timeout_s=60)
