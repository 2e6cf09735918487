"""Local Spark for the audit: one quiet SparkSession with the data sources registered.

Python data source workers run ``PYSPARK_PYTHON``, so it is pinned to the
running interpreter (which has pyarrow and this package). The JVM's start-up
noise is quieted with ``log4j2.properties`` beside this module, and the web UI
is off (no port to bind, nothing to leave running).
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


def prepare_environment() -> None:
    """Environment every Spark process of the audit needs, set before the JVM starts."""
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    # The driver JVM reads this when launched by pyspark's gateway.
    log4j_option = f"-Dlog4j2.configurationFile=file:{LOG4J2_PATH}"
    submit_args = os.environ.get("PYSPARK_SUBMIT_ARGS", "")
    if "log4j2.configurationFile" not in submit_args:
        os.environ["PYSPARK_SUBMIT_ARGS"] = (
            f'--driver-java-options "{log4j_option}" {submit_args or "pyspark-shell"}'
        ).strip()


def local_session(master: str = "local[*]", app_name: str = "tidewater-audit",
                  shuffle_partitions: int | None = None):
    """Start (or reuse) a quiet SparkSession and register the Tidewater data sources."""
    check_spark_available()
    prepare_environment()
    from pyspark.sql import SparkSession

    log4j_option = f"-Dlog4j2.configurationFile=file:{LOG4J2_PATH}"
    spark = (
        SparkSession.builder.master(master)
        .appName(app_name)
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        # Audit inputs are small per partition: one shuffle partition per core, not 200.
        .config("spark.sql.shuffle.partitions", str(shuffle_partitions or os.cpu_count() or 2))
        .config("spark.driver.extraJavaOptions", log4j_option)
        .config("spark.executor.extraJavaOptions", log4j_option)
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.sql.session.timeZone", "UTC")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    register_data_sources(spark)
    return spark


def register_data_sources(spark) -> None:
    from tidewater.audit.datasource import register

    register(spark)
