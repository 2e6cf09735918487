"""The SASL users of `make up TLS=1 SASL=1` (deploy/compose-sasl.yml), made on the host.

    .venv/bin/python deploy/sasl_users.py --dir tls

Writes, each mode 0600 and kept when already there (a restart reuses the passwords):
``DIR/sasl/admin.properties`` (the super user; SASL_SSL with ``ssl.ca.location`` naming
``DIR/ca.pem``: the host's ``--command-config``), ``DIR/sasl/broker.properties`` (the
brokers' own user) and ``DIR/sasl/console.properties`` (the web console's user: only
``security.protocol``, ``sasl.*``; the container adds its own TLS lines). Prints the
admin's file. Exit 1 with a one-line reason when ``DIR/ca.pem`` is missing (TLS first).
"""

from __future__ import annotations

import argparse
import os
import secrets
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the checkout, when not installed

from tidewater.tools import cluster_sasl

MECHANISMS = ("SCRAM-SHA-512", "SCRAM-SHA-256", "PLAIN")  # as compose-sasl.yml enables them
CONSOLE_USER = "console"
CONSOLE_PROPERTIES = "console.properties"


def console_properties(directory: Path, mechanism: str) -> Path:
    path = directory / cluster_sasl.SASL_DIR_NAME / CONSOLE_PROPERTIES
    password = (cluster_sasl.read_password(str(path)) if path.exists() else None) \
        or secrets.token_urlsafe(24)
    lines = ["# The web console's user (deploy/compose-sasl.yml); DESCRIBE ACLs only",
             "security.protocol=SASL_SSL", f"sasl.mechanism={mechanism}",
             f"sasl.username={CONSOLE_USER}", f"sasl.password={password}"]
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write("\n".join(lines) + "\n")
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", required=True, type=Path,
                        help="the TLS folder (tide certs cluster --dir); files go in DIR/sasl")
    args = parser.parse_args(argv)
    ca = args.dir / "ca.pem"
    if not ca.exists():
        print(f"sasl_users: no {ca}: SASL=1 needs TLS=1 (tide certs cluster first)",
              file=sys.stderr)
        return 1
    entry = cluster_sasl.admin_properties(args.dir, MECHANISMS, ca=str(ca.resolve()))
    cluster_sasl.broker_properties(args.dir)
    console_properties(args.dir, entry["mechanism"])
    print(entry["command_config"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
