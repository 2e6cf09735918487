"""Console benchmark: every page of `tide console` with 1,000 partitions.

Run:  .venv/bin/python bench/console_bench.py [--partitions 1000] [--runs 5] [--no-browser]

A 3-broker cluster (``tide cluster up --base-port 0``; stopped with ``tide cluster
down``, which kills by the recorded pids) gets topic ``wide`` with ``--partitions``
partitions at replication factor 3 (beside ``__consumer_offsets``' 50), 5 records in
each, and group ``wide-readers`` with a committed offset on every partition. Then
``tide console --data-dir`` runs as a process (metrics scraped every 2 s, as by
default) and each page is fetched ``--runs`` times, 1.2 s apart: past the console's
1 s snapshot cache, so every request describes the cluster afresh (DescribeCluster
and every broker's DescribeReplicas), as a user's first look does.

Columns: ``server ms``: an HTTP GET until the whole page is read (median and max of
the runs); ``KiB``: the page's HTML; ``browser ms``: headless Chromium (Debian's,
through Selenium), from navigation start to the load event (median), for a page as
a person opens it (skipped with ``--no-browser`` or without chromium-driver), and of
that the part after the response's end (the browser's own parsing, layout and
scripts, which the server's speed does not change) and the page's element count.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.bench_common import format_table, machine_description
from tidewater.client.admin import AdminClient
from tidewater.client.group_admin import GroupAdmin
from tidewater.client.producer import Producer
from tidewater.proto.errors import TidewaterError, TopicAlreadyExistsError

ROOT = Path(__file__).resolve().parents[1]
TOPIC, GROUP = "wide", "wide-readers"
T = TypeVar("T")


def tide(*args: str, timeout_s: float = 300) -> str:
    done = subprocess.run([sys.executable, "-m", "tidewater.tools", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=timeout_s)
    if done.returncode != 0:
        raise SystemExit(f"tide {' '.join(args)} failed: {done.stderr.strip()}")
    return done.stdout


def pages(partitions: int) -> list[tuple[str, str]]:
    middle = partitions // 2
    return [
        ("overview", "/"),
        ("overview: live brokers fragment", "/fragments/brokers"),
        ("topics", "/topics"),
        (f"topic ({partitions} partitions)", f"/topics/{TOPIC}"),
        (f"topic, all {partitions} on one page", f"/topics/{TOPIC}?per_page={partitions}"),
        ("topic + record browser, newest 20", f"/topics/{TOPIC}?partition={middle}"
                                              "&mode=newest&limit=20&format=json"),
        ("groups", "/groups"),
        (f"group (lag of {partitions} partitions)", f"/groups/{GROUP}"),
        ("charts", "/charts"),
        ("charts: live fragment", "/fragments/charts"),
    ]


def retrying(what: str, call: Callable[[], T], timeout_s: float = 120) -> T:
    """``call()``, again after a retriable error (NOT_CONTROLLER while the quorum elects,
    a timeout) until ``timeout_s``; each retry is printed, and any other error raises."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return call()
        except TidewaterError as e:
            if not e.retriable or time.monotonic() > deadline:
                raise
            print(f"  {what}: {e.error_name}, retrying: {e}", file=sys.stderr)
            time.sleep(1)


def seed(bootstrap: str, partitions: int) -> None:
    started = time.monotonic()
    with AdminClient(bootstrap) as admin:
        def create() -> None:
            try:
                admin.create_topic(TOPIC, partitions, 3)
            except TopicAlreadyExistsError:
                pass  # a retried create whose first attempt timed out but went through
        retrying("CreateTopics", create)
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            [t] = retrying("DescribeTopics", lambda: admin.describe_topics(
                [TOPIC], with_replica_state=False))
            if all(p.leader >= 0 and len(p.isr) == 3 for p in t.partitions):
                break
            time.sleep(1)
        else:
            raise SystemExit("topic not fully replicated within 300 s")
    print(f"created {TOPIC} ({partitions} x RF 3) in {time.monotonic() - started:.1f} s",
          file=sys.stderr)
    with Producer(bootstrap, acks="all") as p:
        for partition in range(partitions):
            for i in range(5):
                p.send(TOPIC, json.dumps({"partition": partition, "i": i}).encode(),
                       key=f"k{i}".encode(), partition=partition)
        p.flush(120)
    with GroupAdmin(bootstrap) as groups:
        retrying("reset_offsets",
                 lambda: groups.reset_offsets(GROUP, TOPIC, to="offset", offset=2))
    print(f"seeded in {time.monotonic() - started:.1f} s", file=sys.stderr)


def start_console(data_dir: Path, log: Path) -> tuple[subprocess.Popen[bytes], str]:
    with open(log, "wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "tidewater.tools", "console",
                                 "--data-dir", str(data_dir), "--listen", "127.0.0.1:0"],
                                cwd=ROOT, stdout=out, stderr=subprocess.STDOUT,
                                env={**os.environ, "PYTHONUNBUFFERED": "1"})
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        for line in log.read_text(errors="replace").splitlines():
            if line.startswith("console: "):
                return proc, line.split(" ", 1)[1].rstrip("/")
        if proc.poll() is not None:
            break
        time.sleep(0.1)
    stop(proc)
    raise SystemExit(f"tide console did not start: {log.read_text(errors='replace')}")


def stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        os.kill(proc.pid, signal.SIGTERM)
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(10)


def http_get_ms(url: str) -> tuple[float, int]:
    started = time.perf_counter()
    with urllib.request.urlopen(url, timeout=60) as response:
        body = response.read()
        if response.status != 200:
            raise SystemExit(f"{url}: HTTP {response.status}")
    return (time.perf_counter() - started) * 1000, len(body)


def browser_driver():  # type: ignore[no-untyped-def]
    chromium, driver_path = shutil.which("chromium"), shutil.which("chromedriver")
    if not (chromium and driver_path):
        return None
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
    except ImportError:
        return None
    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--window-size=1280,900",
                "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1"):
        options.add_argument(arg)
    return webdriver.Chrome(service=Service(executable_path=driver_path), options=options)


def browser_load_ms(driver, url: str) -> tuple[float, float, int]:  # type: ignore[no-untyped-def]
    """Navigation start to the load event; the response's end to the load event (the
    browser's own work: parsing, style, layout, scripts); the page's element count."""
    driver.get(url)
    load, own, elements = driver.execute_script(
        "const n = performance.getEntriesByType('navigation')[0];"
        "return [n.loadEventEnd, n.loadEventEnd - n.responseEnd,"
        " document.getElementsByTagName('*').length]")
    return float(load), float(own), int(elements)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--partitions", type=int, default=1000)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--no-browser", action="store_true")
    parser.add_argument("--dir", type=Path, default=None, help="cluster folder (default: a temp dir)")
    args = parser.parse_args()
    base = args.dir or Path(tempfile.mkdtemp(prefix="console-bench-"))
    data_dir = base / "cluster"
    bootstrap = tide("cluster", "up", "--brokers", "3", "--data-dir", str(data_dir),
                     "--base-port", "0", "--ready-timeout-s", "60").strip().splitlines()[-1]
    console = None
    driver = None
    try:
        seed(bootstrap, args.partitions)
        console, url = start_console(data_dir, base / "console.log")
        time.sleep(5)  # a few metrics scrapes, so the charts have lines to draw
        rows = []
        if not args.no_browser:
            driver = browser_driver()
            if driver is None:
                print("no chromium/chromedriver/selenium: browser column skipped", file=sys.stderr)
        for name, path in pages(args.partitions):
            server, size = [], 0
            for _ in range(args.runs):
                time.sleep(1.2)
                ms, size = http_get_ms(url + path)
                server.append(ms)
            shown = own = elements = "-"
            if driver is not None:
                loads = []
                for _ in range(args.runs):
                    time.sleep(1.2)
                    loads.append(browser_load_ms(driver, url + path))
                shown = f"{statistics.median(m[0] for m in loads):.0f}"
                own = f"{statistics.median(m[1] for m in loads):.0f}"
                elements = str(loads[-1][2])
            rows.append([name, f"{statistics.median(server):.0f}", f"{max(server):.0f}",
                         f"{size / 1024:.0f}", shown, own, elements])
            print(f"  {name}: {rows[-1][1:]}", file=sys.stderr)
        machine = machine_description()
        print(f"tide console, {args.partitions} partitions of {TOPIC} (RF 3) + 50 of "
              f"__consumer_offsets, 3 brokers; {args.runs} runs per page, each past the 1 s "
              "snapshot cache")
        print(f"machine: {machine}")
        print(format_table(["page", "server ms (median)", "server ms (max)", "KiB",
                            "browser ms to load (median)", "of which after the response",
                            "elements"], rows))
    finally:
        if driver is not None:
            driver.quit()
        if console is not None:
            stop(console)
        tide("cluster", "down", "--data-dir", str(data_dir), "--timeout-s", "10")
        if args.dir is None:
            shutil.rmtree(base, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
