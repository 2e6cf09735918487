"""Issue 26: ``tide cluster up --controllers 3`` runs a quorum of controllers; killing the
active one (``tide cluster kill controller-N``) hands the cluster to another, with a
higher controller epoch, and admin requests through the brokers keep working."""

from __future__ import annotations

import json

import pytest
from cluster_fixtures import start_cluster, stop_cluster, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]


def controller_of(c) -> tuple[int, int] | None:
    """(controller id, epoch) as the brokers' Metadata shows them, when all 3 are live."""
    result = c.tide("cluster", "describe", "--json")
    if result.returncode != 0:
        return None
    shown = json.loads(result.stdout)
    if sum(not b["fenced"] for b in shown["brokers"]) != 3:
        return None
    return shown["controller"]["id"], shown["controller"]["epoch"]


def test_cluster_up_with_three_controllers_survives_killing_the_active_one(tmp_path):
    c = start_cluster(tmp_path / "cluster", 3, "min.insync.replicas=2",
                      up_flags=("--controllers", "3"))
    try:
        manifest = c.manifest()
        assert [p for p in manifest["processes"] if p.startswith("controller")] == [
            "controller-1", "controller-2", "controller-3"]
        assert len(manifest["controllers"]) == 3
        active, epoch = wait_for(lambda: controller_of(c), "an active controller")
        assert active in (1, 2, 3)
        assert c.tide("topics", "create", "before", "--partitions", "2",
                      "--replication-factor", "3").returncode == 0

        killed = c.tide("cluster", "kill", f"controller-{active}", "--signal", "KILL",
                        "--data-dir", str(c.data_dir))
        assert killed.returncode == 0, killed.stderr

        def moved():
            now = controller_of(c)
            return now if now is not None and now[0] != active else None

        successor, new_epoch = wait_for(moved, "another active controller", 60)
        assert new_epoch > epoch
        created = wait_for(lambda: c.tide("topics", "create", "after", "--partitions", "2",
                                          "--replication-factor", "3").returncode == 0,
                           "a topic created under the new controller", 60)
        assert created
        listed = c.tide("topics", "list")
        assert "before" in listed.stdout and "after" in listed.stdout
        status = c.tide("cluster", "status", "--data-dir", str(c.data_dir), "--json")
        alive = {p["name"]: p["alive"] for p in json.loads(status.stdout)["processes"]}
        assert alive[f"controller-{active}"] is False
        assert sum(alive.values()) == 5
    finally:
        stop_cluster(c)
