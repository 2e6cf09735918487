"""`tide consume --group` and `tide groups list|describe|delete|reset-offsets` against a
real controller and 3 brokers (issue 16)."""

from __future__ import annotations

import datetime
import json
import threading
import time

import pytest
from cluster_fixtures import start_cluster, stop_cluster, wait_for

from tidewater.client.consumer import Consumer

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    c = start_cluster(tmp_path_factory.mktemp("groups-cli"), 3, "offsets.topic.num.partitions=4",
                      "group.min.session.timeout.ms=1000", "group.initial.rebalance.delay.ms=0")
    yield c
    stop_cluster(c)


def make_topic(c, name: str, partitions: int = 3) -> str:
    result = c.tide("topics", "create", name, "--partitions", str(partitions),
                    "--replication-factor", "3")
    assert result.returncode == 0, result.stderr
    return name


def produce(c, topic: str, values: list[str]) -> None:
    result = c.tide("produce", topic, "--acks", "all", input="".join(v + "\n" for v in values))
    assert result.returncode == 0, result.stderr


def describe(c, group: str) -> dict:
    result = c.tide("groups", "describe", group, "--json")
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def test_consume_with_a_group_commits_and_the_next_run_carries_on(cluster):
    c = cluster
    topic = make_topic(c, "cli-carry")
    produce(c, topic, [f"a{i}" for i in range(30)])
    first = c.tide("consume", topic, "--group", "g1", "--from-beginning", "--timeout-ms", "3000")
    assert first.returncode == 0, first.stderr
    assert sorted(first.stdout.split()) == sorted(f"a{i}" for i in range(30))
    produce(c, topic, [f"b{i}" for i in range(10)])
    second = c.tide("consume", topic, "--group", "g1", "--from-beginning", "--timeout-ms", "3000")
    assert sorted(second.stdout.split()) == sorted(f"b{i}" for i in range(10))  # only the new

    assert "g1" in c.tide("groups", "list").stdout.split()
    d = describe(c, "g1")
    assert d["state"] == "Empty" and d["members"] == []
    assert sum(p["committed_offset"] for p in d["partitions"]) == 40
    assert all(p["lag"] == 0 for p in d["partitions"])
    produce(c, topic, ["c0", "c1"])
    table = c.tide("groups", "describe", "g1")
    assert table.returncode == 0, table.stderr
    lines = table.stdout.splitlines()
    assert lines[0].split() == ["GROUP", "TOPIC", "PARTITION", "CURRENT-OFFSET",
                                "LOG-END-OFFSET", "LAG", "CONSUMER-ID", "HOST", "CLIENT-ID"]
    assert sum(int(line.split()[5]) for line in lines[1:]) == 2
    assert "has no active members" in table.stderr


def test_reset_offsets_is_refused_while_the_group_has_members_then_moves_them(cluster):
    c = cluster
    topic = make_topic(c, "cli-reset")
    produce(c, topic, [f"v{i}" for i in range(12)])
    member = Consumer(c.bootstrap, group_id="g2", auto_offset_reset="earliest",
                      session_timeout_ms=3000, heartbeat_interval_ms=300)
    try:
        member.subscribe([topic])
        got = 0
        deadline = time.monotonic() + 30
        while got < 12 and time.monotonic() < deadline:
            got += len(member.poll(500))
        member.commit()
        d = describe(c, "g2")
        assert d["state"] == "Stable" and len(d["members"]) == 1
        assert d["members"][0]["host"] == "/127.0.0.1"  # the gRPC client's address
        assert sorted(tuple(tp) for tp in d["members"][0]["partitions"]) == [
            (topic, 0), (topic, 1), (topic, 2)]
        refused = c.tide("groups", "reset-offsets", "g2", "--topic", topic, "--to-earliest")
        assert refused.returncode != 0 and "empty" in refused.stderr
        refused = c.tide("groups", "delete", "g2")
        assert refused.returncode != 0 and "NON_EMPTY_GROUP" in refused.stderr
    finally:
        member.close()  # leaves the group
    wait_for(lambda: describe(c, "g2")["state"] == "Empty", "the group empty")

    dry = c.tide("groups", "reset-offsets", "g2", "--topic", topic, "--to-earliest", "--dry-run")
    assert dry.returncode == 0, dry.stderr
    assert sum(p["committed_offset"] for p in describe(c, "g2")["partitions"]) == 12
    # Kafka's default is a dry run too, saying so.
    default = c.tide("groups", "reset-offsets", "g2", "--topic", topic, "--to-earliest")
    assert default.returncode == 0 and "--execute option is missing" in default.stderr
    assert sum(p["committed_offset"] for p in describe(c, "g2")["partitions"]) == 12
    done = c.tide("groups", "reset-offsets", "g2", "--topic", topic, "--to-earliest",
                  "--execute")
    assert done.returncode == 0, done.stderr
    assert all(p["committed_offset"] == 0 for p in describe(c, "g2")["partitions"])
    again = c.tide("consume", topic, "--group", "g2", "--timeout-ms", "3000")
    assert sorted(again.stdout.split()) == sorted(f"v{i}" for i in range(12))

    c.tide("groups", "reset-offsets", "g2", "--topic", topic, "--to-offset", "1", "--execute")
    assert all(p["committed_offset"] == min(1, p["log_end_offset"])  # clamped to the log
               for p in describe(c, "g2")["partitions"])
    c.tide("groups", "reset-offsets", "g2", "--topic", topic, "--to-latest", "--execute")
    assert sum(p["committed_offset"] for p in describe(c, "g2")["partitions"]) == 12
    future = (datetime.datetime.now(datetime.UTC) + datetime.timedelta(hours=1)).strftime(
        "%Y-%m-%dT%H:%M:%S")
    past = "2000-01-01T00:00:00"
    c.tide("groups", "reset-offsets", "g2", "--topic", topic, "--to-datetime", past, "--execute")
    assert all(p["committed_offset"] == 0 for p in describe(c, "g2")["partitions"])
    c.tide("groups", "reset-offsets", "g2", "--topic", topic, "--to-datetime", future,
           "--execute")
    assert sum(p["committed_offset"] for p in describe(c, "g2")["partitions"]) == 12

    deleted = c.tide("groups", "delete", "g2")
    assert deleted.returncode == 0, deleted.stderr
    assert "g2" not in c.tide("groups", "list").stdout.split()
    assert describe(c, "g2")["state"] == "Dead"


def test_the_consumer_auto_commits_and_calls_its_rebalance_callbacks(cluster):
    c = cluster
    topic = make_topic(c, "cli-auto", partitions=2)
    produce(c, topic, [f"x{i}" for i in range(20)])
    events: list[tuple[str, list]] = []
    first = Consumer(c.bootstrap, group_id="g3", auto_offset_reset="earliest",
                     auto_commit_interval_ms=200, session_timeout_ms=3000,
                     heartbeat_interval_ms=300, partition_assignment_strategy="roundrobin")
    second = None
    try:
        first.subscribe([topic], on_assign=lambda p: events.append(("assign", p)),
                        on_revoke=lambda p: events.append(("revoke", p)))
        got = 0
        deadline = time.monotonic() + 30
        while got < 20 and time.monotonic() < deadline:
            got += len(first.poll(300))
        assert got == 20
        time.sleep(0.3)
        first.poll(100)  # the interval passed: this poll commits
        assert sum(p["committed_offset"] for p in describe(c, "g3")["partitions"]) == 20
        assert events == [("assign", [(topic, 0), (topic, 1)])]
        # A second member (polling on its own thread, as members do): the first revokes
        # both partitions, then gets one back.
        second = Consumer(c.bootstrap, group_id="g3", auto_offset_reset="earliest",
                          session_timeout_ms=3000, heartbeat_interval_ms=300,
                          partition_assignment_strategy="roundrobin")
        second.subscribe([topic])
        stop = threading.Event()
        second_got: list = []

        def poll_second():
            while not stop.is_set():
                second_got.extend(second.poll(200))
        thread = threading.Thread(target=poll_second)
        thread.start()
        try:
            deadline = time.monotonic() + 30
            while len(events) < 3 and time.monotonic() < deadline:
                first.poll(200)
            wait_for(lambda: len(second.assignment()) == 1, "the second member's partition")
        finally:
            stop.set()
            thread.join(30)
        assert events[1] == ("revoke", [(topic, 0), (topic, 1)])
        assert events[2][0] == "assign" and len(events[2][1]) == 1
        assert set(second.assignment()) | {tuple(tp) for tp in events[2][1]} == {
            (topic, 0), (topic, 1)}
        assert second_got == []  # it started at the group's committed offsets
    finally:
        first.close()
        if second is not None:
            second.close()


def test_a_consumer_that_stops_polling_leaves_and_its_next_poll_rejoins(cluster):
    c = cluster
    topic = make_topic(c, "cli-stalled", partitions=1)
    produce(c, topic, ["s0"])
    consumer = Consumer(c.bootstrap, group_id="g4", auto_offset_reset="earliest",
                        session_timeout_ms=3000, heartbeat_interval_ms=200,
                        max_poll_interval_ms=1500, enable_auto_commit=False)
    try:
        consumer.subscribe([topic])
        deadline = time.monotonic() + 30
        while not consumer.poll(300) and time.monotonic() < deadline:
            pass
        assert len(describe(c, "g4")["members"]) == 1
        time.sleep(3)  # no poll for twice max_poll_interval_ms: the member leaves
        assert describe(c, "g4")["members"] == []
        consumer.poll(300)
        wait_for(lambda: len(describe(c, "g4")["members"]) == 1, "the member back")
    finally:
        consumer.close()


def test_partitions_added_to_a_subscribed_topic_reach_the_group(cluster):
    """tide topics alter --partitions grows the topic; each member's next metadata refresh
    sees more partitions than were assigned and the group shares them out again."""
    c = cluster
    topic = make_topic(c, "cli-grows", partitions=2)
    members = [Consumer(c.bootstrap, group_id="g5", auto_offset_reset="earliest",
                        session_timeout_ms=3000, heartbeat_interval_ms=200,
                        metadata_max_age_ms=500) for _ in range(2)]
    stop = threading.Event()
    got: list[str] = []

    def poll(member):  # one thread per member: a join waits for the others to rejoin
        while not stop.is_set():
            got.extend(r.value.decode() for r in member.poll(100))
    pollers = [threading.Thread(target=poll, args=(m,)) for m in members]
    try:
        for m in members:
            m.subscribe([topic])
        for poller in pollers:
            poller.start()
        wait_for(lambda: sorted(len(m.assignment()) for m in members) == [1, 1],
                 "two partitions shared")
        grown = c.tide("topics", "alter", topic, "--partitions", "4")
        assert grown.returncode == 0, grown.stderr
        assert "now has 4 partitions" in grown.stdout
        wait_for(lambda: sorted(tuple(tp) for m in members for tp in m.assignment()) == [
            (topic, p) for p in range(4)], "the four partitions shared")
        for p in (2, 3):  # records on the new partitions reach the group
            result = c.tide("produce", topic, "--partition", str(p), "--acks", "all",
                            input=f"new{p}\n")
            assert result.returncode == 0, result.stderr
        wait_for(lambda: {"new2", "new3"} <= set(got), "the new partitions' records")
        smaller = c.tide("topics", "alter", topic, "--partitions", "3")
        assert smaller.returncode != 0 and "INVALID_PARTITIONS" in smaller.stderr
    finally:
        stop.set()
        for poller in pollers:
            if poller.is_alive():
                poller.join(timeout=30)
        for m in members:
            m.close()


def _plan(result) -> dict[tuple[str, str, int], int]:
    """The reset plan table: (group, topic, partition) -> new offset."""
    lines = result.stdout.splitlines()
    assert lines[0].split() == ["GROUP", "TOPIC", "PARTITION", "NEW-OFFSET"], result.stdout
    return {(g, t, int(p)): int(o) for g, t, p, o in (line.split() for line in lines[1:])}


def _committed(c, group: str) -> dict[tuple[str, int], int]:
    return {(p["topic"], p["partition"]): p["committed_offset"]
            for p in describe(c, group)["partitions"] if p["committed_offset"] >= 0}


@pytest.mark.timeout(300)
def test_reset_offsets_scopes_and_scenarios_as_kafka_consumer_groups(cluster):
    c = cluster
    a, b = make_topic(c, "cli-scope-a", partitions=2), make_topic(c, "cli-scope-b", partitions=1)
    for topic, partition in ((a, 0), (a, 1), (b, 0)):
        r = c.tide("produce", topic, "--partition", str(partition), "--acks", "all",
                   input="".join(f"{topic}-{partition}-{i}\n" for i in range(10)))
        assert r.returncode == 0, r.stderr
    before = int(time.time() * 1000)

    def reset(*args: str, group: str = "r1"):
        result = c.tide("groups", "reset-offsets", *((group,) if group else ()), *args)
        assert result.returncode == 0, result.stderr
        return _plan(result)

    # Partitions chosen as Kafka's --topic t:0,1; a plan for r1 before it has committed.
    assert reset("--topic", f"{a}:1", "--topic", b, "--to-offset", "4", "--execute") == {
        ("r1", a, 1): 4, ("r1", b, 0): 4}
    assert _committed(c, "r1") == {(a, 1): 4, (b, 0): 4}
    # --shift-by from the committed offsets, clamped to the log.
    assert reset("--topic", b, "--shift-by", "-3", "--execute") == {("r1", b, 0): 1}
    assert reset("--topic", b, "--shift-by", "-5", "--execute") == {("r1", b, 0): 0}
    assert reset("--topic", f"{a}:1", "--shift-by", "100", "--execute") == {("r1", a, 1): 10}
    # A shift of a partition without a committed offset is refused, nothing committed.
    refused = c.tide("groups", "reset-offsets", "r1", "--topic", a, "--shift-by", "1",
                     "--execute")
    assert refused.returncode != 0 and "no committed offset" in refused.stderr
    assert _committed(c, "r1") == {(a, 1): 10, (b, 0): 0}
    # --to-current: the committed offset; the log end where there is none.
    assert reset("--topic", a, "--to-current") == {("r1", a, 0): 10, ("r1", a, 1): 10}
    # --all-topics: every partition the group has committed; a dry run by default.
    assert reset("--all-topics", "--to-earliest", "--dry-run") == {
        ("r1", a, 1): 0, ("r1", b, 0): 0}
    assert _committed(c, "r1") == {(a, 1): 10, (b, 0): 0}
    # --by-duration: the first record at most that long ago (all of them are younger
    # than a day: the log start; none is in the future: the log end).
    assert reset("--all-topics", "--by-duration", "P1D", "--execute") == {
        ("r1", a, 1): 0, ("r1", b, 0): 0}
    assert reset("--all-topics", "--by-duration=-PT1H") == {
        ("r1", a, 1): 10, ("r1", b, 0): 10}
    assert time.time() * 1000 >= before
    # --all-groups: every group, each with its own committed partitions.
    assert reset("--topic", f"{a}:0", "--to-offset", "7", "--execute", group="r2") == {
        ("r2", a, 0): 7}
    plan = reset("--all-groups", "--all-topics", "--to-latest", "--execute", group="")
    assert {k: v for k, v in plan.items() if k[0] in ("r1", "r2")} == {
        ("r1", a, 1): 10, ("r1", b, 0): 10, ("r2", a, 0): 10}
    assert _committed(c, "r2") == {(a, 0): 10}
    # Bad input: typed errors, exit 2 for usage.
    for args in (("--topic", f"{a}:x", "--to-earliest"), ("--topic", a, "--by-duration", "1h"),
                 ("--topic", a), ("--to-earliest",)):
        bad = c.tide("groups", "reset-offsets", "r1", *args)
        assert bad.returncode == 2, (args, bad.stderr)
    both = c.tide("groups", "reset-offsets", "r1", "--all-groups", "--topic", a, "--to-earliest")
    assert both.returncode == 2 and "--all-groups" in both.stderr
    missing = c.tide("groups", "reset-offsets", "r1", "--topic", f"{a}:5", "--to-earliest")
    assert missing.returncode != 0 and "UNKNOWN_TOPIC_OR_PARTITION" in missing.stderr


@pytest.mark.timeout(300)
def test_delete_offsets_of_topics_the_group_does_not_consume(cluster):
    c = cluster
    a, b = make_topic(c, "cli-drop-a", partitions=2), make_topic(c, "cli-drop-b", partitions=1)
    for topic in (a, b):
        produce(c, topic, [f"v{i}" for i in range(6)])
    planted = c.tide("groups", "reset-offsets", "do1", "--topic", a, "--topic", b,
                     "--to-offset", "1", "--execute")
    assert planted.returncode == 0, planted.stderr
    assert set(_committed(c, "do1")) == {(a, 0), (a, 1), (b, 0)}

    dropped = c.tide("groups", "delete-offsets", "do1", "--topic", f"{a}:1")
    assert dropped.returncode == 0, dropped.stderr
    assert dropped.stdout.split() == ["TOPIC", "PARTITION", "STATUS", a, "1", "Successful"]
    assert set(_committed(c, "do1")) == {(a, 0), (b, 0)}

    member = Consumer(c.bootstrap, group_id="do1", session_timeout_ms=3000,
                      heartbeat_interval_ms=300)
    try:
        member.subscribe([b])
        wait_for(lambda: (member.poll(200) is not None
                          and describe(c, "do1")["state"] == "Stable"), "a stable member")
        # A topic a member consumes keeps its offsets; another one's go.
        kept = c.tide("groups", "delete-offsets", "do1", "--topic", b)
        assert kept.returncode == 1
        assert "Error: GROUP_SUBSCRIBED_TO_TOPIC" in kept.stdout
        gone = c.tide("groups", "delete-offsets", "do1", "--topic", a)
        assert gone.returncode == 0, gone.stdout + gone.stderr
        assert set(_committed(c, "do1")) == {(b, 0)}
    finally:
        member.close()
    missing = c.tide("groups", "delete-offsets", "no-such-group", "--topic", a)
    assert missing.returncode != 0 and "GROUP_ID_NOT_FOUND" in missing.stderr
    bad = c.tide("groups", "delete-offsets", "do1", "--topic", f"{a}:one")
    assert bad.returncode == 2
