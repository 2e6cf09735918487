"""Local Spark for the audit: one quiet SparkSession with the data sources registered.

Python data source workers run ``PYSPARK_PYTHON``, so it is pinned to the
running interpreter (which has pyarrow and this package). The driver JVM logs
with ``log4j2.properties`` beside this module: errors on the console, Spark's
INFO lines in a file (``spark_log``). The web UI is off (no port to bind,
nothing to leave running). The master may be ``local[N]`` or a cluster's
``spark://host:port``: executors there run the same interpreter path, so the
workers must have this package installed at that path (make spark-up's do).
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

LOG4J2_PATH = Path(__file__).with_name("log4j2.properties")


class SparkUnavailableError(RuntimeError):
    """pyspark or a Java runtime is missing: the audit cannot run here."""


def check_spark_available() -> None:
    """Raise SparkUnavailableError with the reason when Spark cannot start here."""
    try:
        import pyarrow  # noqa: F401
        import pyspark  # noqa: F401
    except ImportError as e:
        raise SparkUnavailableError(f"pyspark and pyarrow are needed: {e}") from e
    java_home = os.environ.get("JAVA_HOME")
    if not (java_home and Path(java_home, "bin", "java").exists()) and not shutil.which("java"):
        raise SparkUnavailableError("no Java runtime: install a JDK 17+ or set JAVA_HOME")


# The driver JVM compiles with C1 only. An audit's driver lives for tens of seconds
# and does little per-row work (the reader summarizes and merges in Python), so C2's
# compiler threads were the largest JVM cost: 15-20 CPU s a run, on a machine of 2
# cores shared with the Python workers. C1 alone: about 10 CPU s and 6 s less per
# run (docs/benchmarks.md, "Audit at scale"). In local mode the executors are this
# JVM too; on a cluster the executors keep the default.
DRIVER_JIT_OPTION = "-XX:TieredStopAtLevel=1"


def driver_java_options(spark_log: str | Path | None = None) -> str:
    """The driver JVM's options: the audit's log4j2 config (and its log file), C1 only."""
    options = f"-Dlog4j2.configurationFile=file:{LOG4J2_PATH} {DRIVER_JIT_OPTION}"
    if spark_log is not None:
        options += f" -Dtidewater.audit.spark_log={Path(spark_log).resolve()}"
    return options


def prepare_environment(spark_log: str | Path | None = None) -> None:
    """Environment every Spark process of the audit needs, set before the JVM starts."""
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    # The driver JVM reads this when launched by pyspark's gateway.
    log4j_option = driver_java_options(spark_log)
    submit_args = os.environ.get("PYSPARK_SUBMIT_ARGS", "")
    if "log4j2.configurationFile" not in submit_args:
        os.environ["PYSPARK_SUBMIT_ARGS"] = (
            f'--driver-java-options "{log4j_option}" {submit_args or "pyspark-shell"}'
        ).strip()


def local_session(master: str = "local[*]", app_name: str = "tidewater-audit",
                  shuffle_partitions: int | None = None, spark_log: str | Path | None = None):
    """Start (or reuse) a quiet SparkSession and register the Tidewater data sources.

    ``spark_log``: the file for Spark's INFO lines (default: tidewater-audit-spark.log
    in the JVM's temp dir); only the first session of a process sets it.
    """
    check_spark_available()
    prepare_environment(spark_log)
    from pyspark.sql import SparkSession

    log4j_option = driver_java_options(spark_log)
    builder = (
        SparkSession.builder.master(master)
        .appName(app_name)
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        # Audit inputs are small per partition: one shuffle partition per core, not 200.
        .config("spark.sql.shuffle.partitions", str(shuffle_partitions or os.cpu_count() or 2))
        .config("spark.driver.extraJavaOptions", log4j_option)
        .config("spark.sql.session.timeZone", "UTC")
    )
    if driver_on_loopback(master):
        builder = (builder.config("spark.driver.host", "127.0.0.1")
                   .config("spark.driver.bindAddress", "127.0.0.1"))
    spark = builder.getOrCreate()
    register_data_sources(spark)
    return spark


def driver_on_loopback(master: str) -> bool:
    """Whether the driver should listen on 127.0.0.1 only: a local master, or a cluster
    on this machine's loopback (a cluster elsewhere, e.g. in a compose network, must
    reach the driver at its host name)."""
    if master.startswith("local"):
        return True
    host = master.split("://", 1)[-1].rsplit(":", 1)[0]
    return host in ("127.0.0.1", "localhost", "[::1]")


def register_data_sources(spark) -> None:
    from tidewater.audit.datasource import register

    register(spark)
