"""Issue 14, bug 1, through the CLI alone: a re-created topic never serves the deleted one's records.

Broker 3 is paused (SIGSTOP) while ``orders`` is deleted, so the StopReplica
meant for it is lost when the controller fences it; it is then killed and
started again with the old ``orders-*`` logs on disk. Before topic IDs it
adopted those logs when ``orders`` was created again and served the old
records; now each incarnation has its own topic ID (``partition.metadata`` in
every partition directory) and the stale logs are moved aside for deletion.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from cluster_fixtures import fully_replicated as shared_fully_replicated
from cluster_fixtures import run_tide, start_cluster, stop_cluster, wait_for

pytestmark = pytest.mark.integration

SESSION_TIMEOUT_MS = 1500


def fully_replicated(c, name: str) -> dict | None:
    topic = shared_fully_replicated(c, name)
    if topic is None or len(topic["partitions"]) != 3:
        return None
    if any(len(p["replicas_state"]) != 3 for p in topic["partitions"]):
        return None
    return topic


def broker_fenced(c, broker_id: int) -> bool:
    result = c.tide("cluster", "describe", "--json")
    if result.returncode != 0:
        return False
    brokers = {b["id"]: b for b in json.loads(result.stdout)["brokers"]}
    return broker_id in brokers and brokers[broker_id]["fenced"]


def consume_all(c, name: str) -> list[str]:
    result = c.tide("topics", "describe", name)  # the topic must exist
    assert result.returncode == 0, result.stderr
    result = c.tide("consume", name, "--from-beginning", "--timeout-ms", "3000")
    assert result.returncode == 0, result.stderr
    return result.stdout.splitlines()


def test_recreated_topic_starts_empty_after_a_missed_stop_replica(tmp_path):
    c = start_cluster(tmp_path / "cluster", 3, f"broker.session.timeout.ms={SESSION_TIMEOUT_MS}")
    data_dir = Path(c.data_dir)
    try:
        created = c.tide("topics", "create", "orders", "--partitions", "3",
                         "--replication-factor", "3")
        assert created.returncode == 0, created.stderr
        old = wait_for(lambda: fully_replicated(c, "orders"), "orders fully replicated")
        # 100 records in each partition: whichever one broker 3 leads later holds old data.
        for partition in range(3):
            produced = c.tide("produce", "orders", "--acks", "all", "--partition", str(partition),
                              input="".join(f"old-{partition}-{i}\n" for i in range(100)))
            assert produced.returncode == 0, produced.stderr
        assert len(consume_all(c, "orders")) == 300

        assert run_tide("cluster", "kill", "3", "--signal", "STOP",
                        "--data-dir", str(data_dir)).returncode == 0
        deleted = c.tide("topics", "delete", "orders")
        assert deleted.returncode == 0, deleted.stderr
        wait_for(lambda: broker_fenced(c, 3), "broker 3 fenced (session timeout)")
        assert run_tide("cluster", "kill", "3", "--signal", "KILL",
                        "--data-dir", str(data_dir)).returncode == 0
        # The paused broker never got its StopReplica: its old logs are still on disk.
        assert sorted(p.name for p in (data_dir / "broker-3").glob("orders-*")) == [
            "orders-0", "orders-1", "orders-2"]
        started = run_tide("cluster", "start", "3", "--data-dir", str(data_dir), timeout_s=90)
        assert started.returncode == 0, started.stderr

        def create_again():
            result = c.tide("topics", "create", "orders", "--partitions", "3",
                            "--replication-factor", "3")
            # Broker 3 counts as a live broker only once it registered again.
            return result.returncode == 0 or "INVALID_REPLICATION_FACTOR" not in result.stderr
        wait_for(create_again, "orders created again")
        new = wait_for(lambda: fully_replicated(c, "orders"), "new orders fully replicated")
        assert len(new["topic_id"]) == 22 and new["topic_id"] != old["topic_id"]
        assert f"TopicId: {new['topic_id']}" in c.tide("topics", "describe", "orders").stdout
        assert consume_all(c, "orders") == []
        for p in new["partitions"]:
            for replica in p["replicas_state"]:
                assert replica["log_end_offset"] == 0, (p["partition"], replica)

        produced = c.tide("produce", "orders", "--acks", "all",
                          input="".join(f"new-{i}\n" for i in range(30)))
        assert produced.returncode == 0, produced.stderr
        assert sorted(consume_all(c, "orders")) == sorted(f"new-{i}" for i in range(30))
        # The old incarnation's directories were moved aside and deleted in the background.
        wait_for(lambda: not list((data_dir / "broker-3").glob("orders-*-delete")),
                 "old logs deleted")
    finally:
        stop_cluster(c)
