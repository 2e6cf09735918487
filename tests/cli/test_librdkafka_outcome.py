"""librdkafka_outcome: every test's outcome from a runner that aborted mid-summary, timed
out, or finished, read as the runner prints it (colours included)."""

from __future__ import annotations

import json

import pytest
from librdkafka_outcome import problems, read_outcomes, slowest

pytestmark = pytest.mark.timeout(30)

GREEN, RED, CYAN, CLEAR = "\x1b[32m", "\x1b[31m", "\x1b[36m", "\x1b[0m"

# What the landing CI's runner left: 0086 failed (its delivery reports, then an
# assertion), <MAIN> aborted in test_wait_exit() and stdout's buffered summary table
# stopped after its first rows.
ABORTED = f"""\
{CYAN}[0001_multiobj               /  1.088s] {GREEN}================= Test 0001_multiobj PASSED ================={CLEAR}
{CYAN}[0086_purge_remote           /  1.522s] TEST FAILURE
{CLEAR}{RED}### Test "0086_purge_remote" failed at 0086-purge.c:135:dr_msg_cb() at Sun Nov 29 07:05:15 2026: ###
Expected message #0 to fail with Local: Purged in flight, not Success
{CLEAR}{RED}### Test "0086_purge_remote" failed at 0086-purge.c:135:dr_msg_cb() at Sun Nov 29 07:05:15 2026: ###
Expected message #1 to fail with Local: Purged in flight, not Success
{CLEAR}{RED}### Test "0086_purge_remote" failed at 0086-purge.c:169:purge_and_expect() at Sun Nov 29 07:05:15 2026: ###
Test assertion failed: "waitmsgs->cnt == exp_remain": remote:272: expected 10 messages remaining, not 0
{CYAN}[0089_max_poll_interval      / 22.356s] {GREEN}================= Test 0089_max_poll_interval PASSED ================={CLEAR}
{CYAN}[0103_transactions           / 80.100s] Starting transaction
TEST 20261129070357 (bare, scenario default) SUMMARY
#==================================================================#
|{GREEN} <MAIN>                                   |     PASSED | 250.295s {CLEAR}|
|{GREEN} 0001_multiobj                            |     PASSED |   1.088s {CLEAR}|
|{RED} 0086_purge_remote                        |     FAILED |   1.530s {CLEAR}| Expected message
|{GREEN} 0089_max_poll_interval                   |     PASSED |  22.356s {CLEAR}|
| 010[<MAIN>                      /250.295s] 6 thread(s) in use by librdkafka
{RED}### Test "<MAIN>" failed at test.c:1596:test_wait_exit() at Sun Nov 29 07:07:57 2026: ###
6 thread(s) still active in librdkafka
"""


def test_an_aborted_runner_reports_each_test_from_its_stderr_and_partial_table():
    outcomes = read_outcomes(ABORTED)
    assert outcomes["0001_multiobj"].state == "PASSED"
    assert outcomes["0089_max_poll_interval"].duration_s == pytest.approx(22.356)
    purge = outcomes["0086_purge_remote"]
    assert purge.state == "FAILED" and len(purge.failures) == 3
    assert purge.failures[0] == ("0086-purge.c:135:dr_msg_cb: Expected message #0 to fail "
                                 "with Local: Purged in flight, not Success")
    found = problems(outcomes, ("0001", "0086", "0089", "0103", "0129"))
    assert [line.split(" ")[0] for line in found] == [
        "0086_purge_remote", "0103_transactions", "0129:"]
    assert found[0].startswith("0086_purge_remote failed after 1.5s: 0086-purge.c:135")
    assert found[0].endswith("(+2 more)")
    assert found[1] == "0103_transactions still running when the runner stopped after 80.1s"
    assert found[2] == "0129: not run (nothing reported)"
    assert slowest(outcomes, 2) == "0103_transactions 80.1s, 0089_max_poll_interval 22.4s"


def test_the_report_file_wins_over_the_lines_and_a_timeout_is_named(tmp_path):
    report = tmp_path / "report.json"
    report.write_text(json.dumps({"id": "x", "tests": {
        "<MAIN>": {"name": "<MAIN>", "state": "PASSED", "duration": 300.0},
        "0081_admin": {"name": "0081_admin", "state": "PASSED", "duration": 243.5},
        "0086_purge_local": {"name": "0086_purge_local", "state": "SKIPPED", "duration": 0},
        "0086_purge_remote": {"name": "0086_purge_remote", "state": "PASSED", "duration": 12.9},
        "0103_transactions": {"name": "0103_transactions", "state": "FAILED",
                              "duration": 180.2},
    }}))
    output = (f"{RED}### Test \"0103_transactions (do_test_fenced_txn:393)\" failed at "
              f"test.c:1216:check_test_timeouts() at Sun Nov 29 07:06:16 2026: ###\n"
              "Test 0103_transactions (do_test_fenced_txn:393) timed out "
              "(timeout set to 180 seconds)\n")
    outcomes = read_outcomes(output, report)
    assert outcomes["0081_admin"].duration_s == 243.5
    assert problems(outcomes, ("0081", "0086", "0103")) == [
        "0103_transactions timed out after 180.2s: test.c:1216:check_test_timeouts "
        "[do_test_fenced_txn:393]: Test 0103_transactions (do_test_fenced_txn:393) timed out "
        "(timeout set to 180 seconds)"]


def test_an_unreadable_report_falls_back_to_the_printed_lines(tmp_path):
    report = tmp_path / "report.json"
    report.write_text('{ "tests": { "0001_multiobj": { "extra": "unescaped "quote"" ')
    outcomes = read_outcomes(ABORTED, report)
    assert outcomes["0001_multiobj"].state == "PASSED"
    assert outcomes["0086_purge_remote"].state == "FAILED"
