"""``tide audit``: check brokers' data, metrics and ack logs for consistency (PySpark).

    tide audit DATA_DIR... [--metrics DIR] [--ack-log FILE...] --out DIR [--master URL]

Starts a quiet Spark driver on ``--master`` (default local[*]; spark://HOST:PORT for
a standalone cluster such as make spark-up's), or uses the one already running in
this process; Spark's own log lines go to ``--out``/spark.log,
runs audit/job.py's rules and writes report.json, report.md, report.html and
violations/*.parquet to ``--out``. Exit code 0 every rule passes, 1 some rule
fails, 2 the input cannot be read (or Spark cannot start here).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tidewater.tools.cli import Subparsers


def register(subparsers: Subparsers) -> None:
    parser = subparsers.add_parser(
        "audit", help="audit broker data dirs, metrics and ack logs with Spark; write a report")
    from tidewater.audit.job import add_arguments

    add_arguments(parser)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from tidewater.audit.job import EXIT_INPUT, run_audit
    from tidewater.audit.session import SparkUnavailableError, check_spark_available

    try:
        check_spark_available()
    except SparkUnavailableError as e:
        print(f"tide: audit: {e}", file=sys.stderr)
        return EXIT_INPUT
    from pyspark import SparkContext

    from tidewater.audit.datasource import register as register_sources
    from tidewater.audit.session import local_session

    owned = SparkContext._active_spark_context is None
    if owned:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        spark = local_session(args.master, spark_log=Path(args.out) / "spark.log")
    else:
        from pyspark.sql import SparkSession

        spark = SparkSession.builder.getOrCreate()
        register_sources(spark)
    try:
        return run_audit(spark, args.data, args.out, args.metrics, args.ack_log, log=print,
                         faults_log=args.faults)
    finally:
        if owned:
            spark.stop()
