"""Where a broker start goes after its logs are loaded, from a broker log (restart_probe's).

    .venv/bin/python bench/probes/restart_timeline.py /tmp/restart-probe/broker-1.log

Per start, from the broker's own log lines: loaded -> the last listener up (the Kafka
listener is started last), -> "registered broker" (the RegisterBroker round trip and the
controller's commit), -> the last "leader of" line (the LeaderAndIsr that follows: each
partition whose leader epoch is new rewrites its leader-epoch-checkpoint, fsynced, in turn).
The first start (the probe's setup) has no registration of its own worth reading and
every later line of it is creation, so it is skipped.
"""

from __future__ import annotations

import argparse
import datetime
from pathlib import Path


def stamp(line: str) -> float:
    return datetime.datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f").timestamp()


def starts(lines: list[str]) -> list[dict[str, float | bool]]:
    found: list[dict[str, float | bool]] = []
    current: dict[str, float | bool] | None = None
    for line in lines:
        if "INFO tidewater.broker: loaded" in line:
            current = {"loaded": stamp(line), "clean": "clean shutdown before: True" in line}
            found.append(current)
        elif current is None:
            continue
        elif "serving Kafka's protocol" in line:
            current["listening"] = stamp(line)
        elif "registered broker" in line:
            current["registered"] = stamp(line)
        elif "leader of" in line and "registered" in current and "stopped" not in current:
            current["leaders_done"] = stamp(line)
        elif "INFO tidewater.broker: broker" in line and line.rstrip().endswith("stopped"):
            current["stopped"] = stamp(line)
    return found[1:]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("log", type=Path)
    args = parser.parse_args()
    print("| restart after | loaded -> listening s | listening -> registered s "
          "| registered -> last leader s |")
    print("|---|---|---|---|")
    for s in starts(args.log.read_text().splitlines()):
        if not all(k in s for k in ("listening", "registered", "leaders_done")):
            continue
        print(f"| {'SIGTERM' if s['clean'] else 'SIGKILL'} "
              f"| {float(s['listening']) - float(s['loaded']):.3f} "
              f"| {float(s['registered']) - float(s['listening']):.3f} "
              f"| {float(s['leaders_done']) - float(s['registered']):.3f} |")


if __name__ == "__main__":
    main()
