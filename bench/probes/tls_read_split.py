"""Where TLS's extra CPU goes on the Kafka listener's read path: leader vs consumer.

    .venv/bin/python bench/probes/tls_read_split.py [--fill-seconds 4] [--rounds 3]
                                                    [--listeners both|plain|tls]

Starts two local 3-broker clusters, one plaintext and one ``--tls`` (stopped at the
end), fills a 1-partition RF=3 topic on each with confluent-kafka (1 KiB records), then
reads it from the start with ``kafka_side.consume_throughput`` (the bench's librdkafka
settings), plaintext and TLS alternated ``--rounds`` times. Per read it prints MB/s, CPU
ms per MB of the partition leader and of this process (the librdkafka consumer; the
other brokers do nothing on a read), and from librdkafka's statistics the mean Fetch
answer size and the read's time per answer (one fetch in flight per broker: MB/s ~
answer / time per answer).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

PROJECT_DIR = Path(__file__).resolve().parents[2]
if str(PROJECT_DIR) not in sys.path:
    sys.path.insert(0, str(PROJECT_DIR))

from bench import kafka_side, tidewater_side  # noqa: E402
from bench.bench_common import format_table, process_cpu_s  # noqa: E402

STATS_INTERVAL_MS = 200


def leader_stats(stats: dict, leader_port: int) -> tuple[int, int]:
    """(answers received, bytes received) from the broker serving ``leader_port``, from one
    librdkafka statistics document (its rtt is no use here: its window ends on the empty
    fetches that wait fetch.wait.max.ms at the high watermark)."""
    for broker in stats.get("brokers", {}).values():
        if broker.get("nodeid", -1) >= 0 and broker.get("nodename", "").endswith(f":{leader_port}"):
            return broker["rx"], broker["rxbytes"]
    return 0, 0


def read_once(cluster: tidewater_side.TidewaterCluster, leader_pid: int,
              leader_port: int) -> tuple:
    last: dict = {}

    def on_stats(text: str) -> None:
        last["doc"] = json.loads(text)

    bootstrap = cluster.local.manifest["kafka_bootstrap"]
    leader_before, client_before = process_cpu_s(leader_pid), process_cpu_s(os.getpid())
    t = kafka_side.consume_throughput(bootstrap, "split", stats_cb=on_stats,
                                      **{"statistics.interval.ms": STATS_INTERVAL_MS},
                                      **cluster.kafka_client_config)
    leader_s = process_cpu_s(leader_pid) - leader_before
    client_s = process_cpu_s(os.getpid()) - client_before
    mb = t.payload_bytes / 1e6
    # The last document is up to STATS_INTERVAL_MS old and counts a few small answers
    # (metadata, offsets): the mean answer is a little low, the time per answer near.
    answers, rx_bytes = leader_stats(last.get("doc", {}), leader_port)
    answer_mb = rx_bytes / answers / 1e6 if answers else 0.0
    answer_ms = 1000 * t.elapsed_s / answers if answers else 0.0
    return (f"{t.mb_per_s:.0f}", f"{1000 * leader_s / mb:.2f}", f"{1000 * client_s / mb:.2f}",
            f"{answer_mb:.2f}", f"{answer_ms:.1f}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--fill-seconds", type=float, default=4)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--listeners", choices=("both", "plain", "tls"), default="both")
    args = parser.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="tide-tls-read-"))
    clusters = {name: tidewater_side.TidewaterCluster(work / name, tls=(name == "tls"))
                for name in ("plain", "tls") if args.listeners in ("both", name)}
    try:
        leaders = {}
        for name, cluster in clusters.items():
            cluster.start()
            cluster.create_topic("split")
            leader = cluster.partition("split").leader
            process = cluster.local.process(leader)
            leaders[name] = (process["pid"], int(process["kafka"].rpartition(":")[2]))
            kafka_side.producer_throughput(cluster.local.manifest["kafka_bootstrap"], "split",
                                           1024, "all", args.fill_seconds,
                                           **cluster.kafka_client_config)
        rows = []
        for round_index in range(args.rounds):
            for name, cluster in clusters.items():
                rows.append((str(round_index), name, *read_once(cluster, *leaders[name])))
        print(format_table(("round", "listener", "MB/s", "leader ms/MB", "consumer ms/MB",
                            "answer MB", "ms per answer"), rows))
    finally:
        for cluster in clusters.values():
            cluster.stop()
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
