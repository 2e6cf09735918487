"""``tide-spark-submit``: the venv's spark-submit, set up for the audit.

    tide-spark-submit --master spark://127.0.0.1:7177 --py-files build/audit.zip \\
        audit/job.py DATA_DIR... --out DIR

Same arguments as spark-submit. What it adds:

- SPARK_HOME = this venv's pyspark package and PYSPARK_PYTHON = this venv's
  Python (pip's spark-submit otherwise looks for SPARK_HOME with the system's
  ``python3`` and fails with "/bin/spark-class: No such file or directory");
- the audit's log4j2 config (audit/log4j2.properties) for the driver JVM, through
  SPARK_SUBMIT_OPTS: the console shows errors, the job's rule table and verdict,
  and Spark's INFO lines go to ``$TIDE_AUDIT_SPARK_LOG`` (default
  ./audit-spark.log);
- no console progress bar (``--conf spark.ui.showConsoleProgress=false``, which
  a later ``--conf`` of the caller overrides).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

DEFAULT_SPARK_LOG = "audit-spark.log"


def submit_command(args: list[str], environ: dict[str, str]) -> tuple[list[str], dict[str, str]]:
    """(argv, env) to exec for ``tide-spark-submit ARGS``."""
    from tidewater.audit.session import driver_java_options
    from tidewater.audit.standalone import spark_environment

    env = spark_environment(environ)
    spark_log = Path(environ.get("TIDE_AUDIT_SPARK_LOG") or DEFAULT_SPARK_LOG).resolve()
    env["SPARK_SUBMIT_OPTS"] = " ".join(
        o for o in (driver_java_options(spark_log), environ.get("SPARK_SUBMIT_OPTS", "")) if o)
    submit = str(Path(env["SPARK_HOME"]) / "bin" / "spark-submit")
    return [submit, "--conf", "spark.ui.showConsoleProgress=false", *args], env


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    command, env = submit_command(args, dict(os.environ))
    os.execve(command[0], command, env)
    return 127  # not reached: execve replaces this process or raises


if __name__ == "__main__":
    sys.exit(main())
