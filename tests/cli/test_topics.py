"""`tide topics create|list|describe|delete` against a real controller and 3 brokers."""

from __future__ import annotations

import json
import time

import pytest
from cluster_fixtures import assert_one_line_error, cluster  # noqa: F401

pytestmark = pytest.mark.integration


def describe_json(cluster, *names):  # noqa: F811
    result = cluster.tide("topics", "describe", *names, "--json")
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)["topics"]


def test_create_list_describe_delete(cluster):  # noqa: F811
    created = cluster.tide("topics", "create", "orders", "--partitions", "3",
                           "--replication-factor", "3", "--config", "min.insync.replicas=2")
    assert created.returncode == 0, created.stderr
    assert "orders" in created.stdout

    listed = cluster.tide("topics", "list")
    assert listed.returncode == 0, listed.stderr
    assert "orders" in listed.stdout.split()

    # Leaders are elected asynchronously; wait until every partition has one and a full ISR.
    deadline = time.monotonic() + 15
    while True:
        [topic] = describe_json(cluster, "orders")
        parts = topic["partitions"]
        if all(p["leader"] >= 0 and len(p["isr"]) == 3 for p in parts) or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert topic["name"] == "orders"
    assert topic["configs"].get("min.insync.replicas") == "2"
    assert [p["partition"] for p in parts] == [0, 1, 2]
    for p in parts:
        assert sorted(p["replicas"]) == [1, 2, 3]
        assert sorted(p["isr"]) == [1, 2, 3]
        assert p["leader"] in p["replicas"] and p["offline"] is False
        assert p["leader_epoch"] >= 0 and p["partition_epoch"] >= 0
        states = {s["broker"]: s for s in p["replicas_state"]}
        assert set(states) == {1, 2, 3}
        for s in states.values():
            assert s["log_end_offset"] == 0 and s["log_start_offset"] == 0
            assert s["high_watermark"] == 0
    # Leaders spread over brokers (preferred replica first differs per partition).
    assert len({p["replicas"][0] for p in parts}) == 3

    text = cluster.tide("topics", "describe", "orders")
    assert text.returncode == 0 and "Partition: 2" in text.stdout and "Isr:" in text.stdout

    deleted = cluster.tide("topics", "delete", "orders")
    assert deleted.returncode == 0, deleted.stderr
    deadline = time.monotonic() + 10
    while "orders" in cluster.tide("topics", "list").stdout.split():
        assert time.monotonic() < deadline, "deleted topic still listed"
        time.sleep(0.2)


def test_create_existing_topic_fails_with_one_line(cluster):  # noqa: F811
    assert cluster.tide("topics", "create", "twice").returncode == 0
    result = cluster.tide("topics", "create", "twice")
    assert_one_line_error(result, "twice", "TOPIC_ALREADY_EXISTS")


def test_bad_topic_names(cluster):  # noqa: F811
    names = ["bad/name", "x" * 250]
    for name in names:
        assert_one_line_error(cluster.tide("topics", "create", name), "INVALID_TOPIC_EXCEPTION")
    listed = cluster.tide("topics", "list").stdout.split()
    assert not set(names) & set(listed)


def test_replication_factor_larger_than_brokers(cluster):  # noqa: F811
    result = cluster.tide("topics", "create", "too-many", "--replication-factor", "5")
    assert_one_line_error(result, "INVALID_REPLICATION_FACTOR")
    assert "too-many" not in cluster.tide("topics", "list").stdout.split()


@pytest.mark.parametrize("config,name", [("segment.bytes=3000000000", "segment.bytes"),
                                         ("retention.ms=99999999999999999999", "retention.ms")])
def test_configs_no_broker_could_host_are_refused(cluster, config, name):  # noqa: F811
    """Issue 14, bug 7: this said "Created topic" and no broker ever hosted the partition."""
    result = cluster.tide("topics", "create", "unhostable", "--config", config)
    assert_one_line_error(result, "INVALID_CONFIG", name, config.split("=")[1])
    assert "unhostable" not in cluster.tide("topics", "list").stdout.split()


def test_usage_errors_exit_2(cluster):  # noqa: F811
    assert_one_line_error(cluster.tide("topics", "create", "t0", "--partitions", "0"), "--partitions")
    assert cluster.tide("topics", "create", "t0", "--partitions", "0").returncode == 2
    result = cluster.tide("topics", "create", "t0", "--config", "novalue")
    assert result.returncode == 2
    assert_one_line_error(result, "KEY=VALUE")


def test_describe_and_delete_unknown_topic(cluster):  # noqa: F811
    assert_one_line_error(cluster.tide("topics", "describe", "nope"), "nope", "UNKNOWN_TOPIC_OR_PARTITION")
    assert_one_line_error(cluster.tide("topics", "delete", "nope"), "nope", "UNKNOWN_TOPIC_OR_PARTITION")


def test_cluster_describe(cluster):  # noqa: F811
    result = cluster.tide("cluster", "describe", "--json")
    assert result.returncode == 0, result.stderr
    info = json.loads(result.stdout)
    assert [b["id"] for b in info["brokers"]] == [1, 2, 3]
    assert all(not b["fenced"] and b["epoch"] >= 0 and b["addresses"] for b in info["brokers"])
    assert info["controller"]["id"] is not None
    assert info["offline_partitions"] == []
    text = cluster.tide("cluster", "describe")
    assert text.returncode == 0 and "Broker 3" in text.stdout and "Partitions:" in text.stdout
