"""The figures issue 30 started from, printed beside the rows that measure them now.

Issue 30 ("Performance: idempotence for free, the CLI at 100 MB/s, latency at the floor,
restarts in a blink") asks that ``make bench`` print every row with the peer and the
earlier figures beside it. These are the figures of its text: the full ``make bench`` of
2026-11-26 and the side-by-side runs it cites, all on other machines of this kind (2
vCPUs, which vary 2-4x between machines), so a row's ratio to the peer is what compares
across runs, more than its value.

Each entry: the row's (section, metric, unit) as ``cluster_bench`` names it, or the TLS
table's (workload, unit), and the text to print (a value, a range, and the ratio to the
peer where the issue gave the peer's figure).
"""

from __future__ import annotations

SOURCE = ("issue 30's starting figures (make bench 2026-11-26 and the A/B runs the issue "
          "cites; other machines of this kind: compare ratios, not values)")

# (section, metric, unit) -> the figure then.
EARLIER: dict[tuple[str, str, str], str] = {
    ("produce", "Producer acks=all 1 KiB", "MB/s"): "93.2 idempotent",
    ("produce", "Producer acks=all 1 KiB, not idempotent", "MB/s"): "129",
    ("produce", "Producer acks=all 1 KiB, idempotent / not", "ratio"): "0.72 (93.2 / 129)",
    ("latency", "ack, one at a time, p50", "ms"): "1.20 (2.7x)",
    ("latency", "e2e @1,000/s p50", "ms"): "2.53 (2.15x)",
    ("kafka", "confluent-kafka e2e @1,000/s p50", "ms"): "4.37",
    ("kafka", "confluent-kafka acks=all 1 KiB", "MB/s"): "165-204; fresh memory 90-111",
    ("restart", "after SIGKILL: launch -> serving", "s"): "1.72 (peer 0.02)",
    ("restart", "after SIGKILL: log loading (broker's own log line)", "s"): "1.0 (60 logs)",
    ("restart", "after clean shutdown: launch -> serving", "s"): "1.01",
}

# The TLS table's rows: (workload, unit) -> TLS / plaintext then.
EARLIER_TLS: dict[tuple[str, str], str] = {
    ("confluent-kafka acks=all 1 KiB", "MB/s"): "0.68 (135 -> 92)",
    ("confluent-kafka read from the start", "MB/s"): "0.64 (578 -> 369)",
}

# ``tide produce --acks all``, 300 MB piped (bench/cli_produce_bench.py): the side-by-side
# runs the issue cites, main then against commit ebe4908.
EARLIER_CLI = ("main against ebe4908 then: 25.2 vs 35.9, 22.2 vs 31.8, 15.6 vs 29.2 MB/s "
               "(0.53-0.70x); the aim: at least 100 MB/s and at least 1.0x ebe4908")

# bench/idempotence_bench.py's settings -> idempotent / not then (the A/B of the
# Producer's defaults, alternated twice, and the 256 KiB rows of make bench 2026-11-26).
EARLIER_IDEMPOTENCE: dict[str, str] = {
    "Producer defaults": "0.45 (33.4 / 73.5)",
    "Producer 256 KiB, 5 in flight": "0.72 (93.2 / 129)",
}

# The machine-limits table: metric -> the figure then.
EARLIER_LIMITS: dict[str, str] = {
    "python start + import broker.process": "0.67",
}
