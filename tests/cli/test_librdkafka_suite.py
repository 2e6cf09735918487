"""librdkafka's own test suite against a Tidewater cluster (issue 28).

Kafka's C client tests itself with `tests/test-runner` against a real cluster; those
tests are the best check that Tidewater answers as Kafka does, in ways our own tests
would not think of. `make librdkafka-suite` builds the runner from Debian's source
package of librdkafka (2.0.2, what kcat uses: tests/librdkafka/build.sh) into
build/librdkafka; this module starts a 3-broker cluster set up as librdkafka's test
scenario "default" expects (topic auto-creation, `num.partitions=4`,
`default.replication.factor=3`), points the runner at it with a `test.conf`, and
requires every test of ``SUITE`` to pass.

``SUITE`` is the subset that fits CI (two tests at a time; 0081_admin, the longest, sets
the pace). Left out: tests that need Kafka's own scripts or its Java test producer
(`KAFKA_PATH`: 0052, 0077, 0098, 0109, 0115), racks set as trivup does (0101), trivup's
SSL/SASL set-up (0097), the long ones (0033, 0091), and 0086_purge_remote: it means to
hold its first ProduceRequest for 5 s (sockem delay) and purge it in flight, but sets that
delay in an on_request_sent interceptor, after librdkafka's send(), when sockem's forwarder
has already queued the request with the connection's 500 ms delay (strace: read 70 us
after the send, forwarded 500 ms later). So the test thread must purge within about half a
second of being woken, or the broker's answer arrives first and the delivery reports say
Success instead of "Purged in flight": a race any broker, Kafka included, loses on a loaded
CI machine (a test thread held 0.7 s before its purge fails the same way every time).
0081_admin's DescribeConsumerGroups closes
static members (which do not leave, KIP-345) and deletes their groups one session timeout
later; DeleteGroups now expires the ended sessions itself instead of waiting for the
coordinator's next tick (which lags on a loaded machine), as Kafka's per-member timers.
The cluster sets `group.initial.rebalance.delay.ms=0`, as Kafka's own config/server.properties
does "for development and testing": with Kafka's default of 3 s each new group's first
join waits 3 s, and the suite forms dozens of groups (0081_admin alone took 243 s instead
of 95 s). And `broker.session.timeout.ms=9000`, Kafka's default: with Tidewater's 3 s a
broker starved of CPU on a loaded CI machine misses its heartbeats, is fenced and loses its
leaderships mid-test (19 fencings in one run: clients then see UNKNOWN_TOPIC_OR_PARTITION
and requests time out), which no librdkafka test expects.
Two tests assert timings that a loaded 2-core CI machine can miss on any broker: 0110
checks that the producer's average batch lies within one message of ``batch.size`` (seen:
3,811 bytes against 3,900..5,000, while 57 tests ran beside it), and 0118 commits inside a
rebalance callback within its session. When only these failed, they run once more, alone,
and must pass then; any other failure, or theirs twice, fails the test.
Locally, without the runner, the module is skipped; under CI it fails instead.
2.0.2's suite has no IncrementalAlterConfigs test (0081_admin has one from librdkafka
2.2); librdkafka 2.15's 0081 and 0011 were run by hand outside CI, which cannot fetch
them (docs/kafka-compatibility.md).
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from cluster_fixtures import start_cluster, stop_cluster
from librdkafka_outcome import ANSI, problems, read_outcomes, slowest

pytestmark = [pytest.mark.integration, pytest.mark.timeout(900)]

PROJECT_DIR = Path(__file__).resolve().parents[2]
SOURCE_DIR = Path(os.environ.get("LIBRDKAFKA_SUITE_DIR",
                                  PROJECT_DIR / "build" / "librdkafka")) / "src"
RUNNER = SOURCE_DIR / "tests" / "test-runner"
# Below the module's pytest timeout, so a runner that hangs is reported test by test.
RUNNER_TIMEOUT_S = 840

# Test numbers, each a whole librdkafka test (its sub-tests included).
SUITE = (
    # producing: acks, batches, order, sizes, compression, headers, timestamps
    "0001", "0002", "0003", "0005", "0007", "0008", "0011", "0012", "0013", "0017",
    "0021", "0035", "0040", "0057", "0064", "0070", "0073", "0085", "0090", "0110",
    # consuming: offsets, seeks, fetch sizes, many topics, lag, empty topics
    "0014", "0015", "0029", "0031", "0034", "0036", "0041", "0042", "0044", "0054",
    "0059", "0061", "0067", "0099", "0112",
    # statistics: the client's JSON stats of a running cluster
    "0053",
    # consumer groups: subscribe, assign, rebalance protocols, commits, static members
    "0018", "0019", "0022", "0026", "0030", "0045", "0048", "0051", "0056", "0063",
    "0069", "0089", "0093", "0102", "0113", "0114", "0118", "0130",
    # the admin API: topics, partitions, configs, ACLs, records, groups, offsets
    "0081",
    # a topic's message.format.version changed mid-stream (accepted, no effect)
    "0092",
    # transactions: commit, abort, fencing, offsets in transactions, aborted records
    "0103", "0129",
)
# Timing-bound tests (module docstring): run once more, alone, when only they failed.
RERUN_ALONE = ("0110", "0118")


@pytest.fixture(scope="module")
def runner() -> Path:
    if not os.access(RUNNER, os.X_OK):
        message = (f"librdkafka's test-runner is not built ({RUNNER}); "
                   "`make librdkafka-suite` builds it from Debian's source package")
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    return RUNNER


@pytest.fixture(scope="module")
def suite_cluster(tmp_path_factory):
    c = start_cluster(tmp_path_factory.mktemp("librdkafka"), 3, "num.partitions=4",
                      "default.replication.factor=3", "group.initial.rebalance.delay.ms=0",
                      "broker.session.timeout.ms=9000")
    c.kafka = c.manifest()["kafka_bootstrap"]  # type: ignore[attr-defined]
    yield c
    stop_cluster(c)


def test_librdkafka_suite_passes(runner, suite_cluster, tmp_path):
    conf = tmp_path / "test.conf"
    conf.write_text(f"bootstrap.servers={suite_cluster.kafka}\n")
    env = dict(os.environ,
               RDKAFKA_TEST_CONF=str(conf), TEST_KAFKA_VERSION="3.5.0",
               LD_LIBRARY_PATH=f"{SOURCE_DIR / 'src'}:{SOURCE_DIR / 'src-cpp'}")
    # -p2: two tests at a time (two cores).
    outcomes, result, stopped = _run(runner, env, SUITE, tmp_path / "report.json", "-p2")
    not_passed = problems(outcomes, SUITE)
    failing = tuple(sorted({line[:4] for line in not_passed}))
    if not_passed and set(failing) <= set(RERUN_ALONE):
        first = not_passed
        outcomes, result, stopped = _run(runner, env, failing, tmp_path / "rerun.json", "-p1")
        not_passed = [f"{line} (with the suite: {'; '.join(first)})"
                      for line in problems(outcomes, failing)]
    assert not not_passed, (
        f"{len(not_passed)} of {len(SUITE)} librdkafka tests did not pass (runner: {stopped}):\n"
        + "\n".join(not_passed) + f"\nslowest: {slowest(outcomes)}")
    # Every test passed; the runner itself may still fail, e.g. <MAIN> in test_wait_exit()
    # when a client's threads outlived its test.
    assert result is not None and result.returncode == 0, (
        f"every test passed but the runner ended with {stopped}:\n" + _main_failures(result))


def _run(runner: Path, env: dict[str, str], tests: tuple[str, ...], report: Path,
         parallel: str) -> tuple[dict, subprocess.CompletedProcess[str] | None, str]:
    """Run ``tests`` with the runner: their outcomes, the finished run (None: killed) and
    how it stopped. The runner's JSON report is written and closed before the runner may
    abort (see librdkafka_outcome), unlike its summary table on buffered stdout."""
    env = dict(env, TESTS=",".join(tests), TEST_REPORT=str(report))
    # -L: tests that need a broker; -Q: quick mode; -E: no socket-emulation tests.
    try:
        result = subprocess.run([str(runner), "-L", "-Q", "-E", parallel], cwd=runner.parent,
                                env=env, capture_output=True, text=True, timeout=RUNNER_TIMEOUT_S)
        output, stopped = result.stdout + result.stderr, f"exit status {result.returncode}"
    except subprocess.TimeoutExpired as expired:
        output = _text(expired.stdout) + _text(expired.stderr)
        stopped = f"killed after {RUNNER_TIMEOUT_S} s"
        result = None
    return read_outcomes(output, report), result, stopped


def _text(captured: str | bytes | None) -> str:
    if isinstance(captured, bytes):
        return captured.decode(errors="replace")
    return captured or ""


def _main_failures(result: subprocess.CompletedProcess[str]) -> str:
    lines = ANSI.sub("", result.stdout + result.stderr).splitlines()
    picked = [f"{line}\n{lines[i + 1] if i + 1 < len(lines) else ''}"
              for i, line in enumerate(lines) if '### Test "<MAIN>"' in line]
    return "\n".join(picked) or "\n".join(lines[-20:])
