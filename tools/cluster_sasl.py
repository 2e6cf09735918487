"""SASL and ACLs for a local cluster (``tide cluster up --sasl-mechanisms ... --authorizer
acl``): broker flags, and the ``admin`` super user every such cluster starts with.

The admin's password is made at random once and kept in ``DIR/sasl/admin.properties``
(mode 0600, Kafka's client format: ``security.protocol``, ``sasl.mechanism``,
``sasl.username``, ``sasl.password``, and ``ssl.ca.location`` with TLS), so ``tide
--command-config`` and Kafka clients use it as it is; a restart reuses it. The user is
created by the controller itself at start-up (``--bootstrap-user-config``, as
`kafka-storage format --add-scram`): with SASL on, no one could authenticate to create
it. The brokers authenticate to the controller as that user too (a super user, so it
has CLUSTER_ACTION).
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path
from typing import TypedDict

from tidewater.proto.scram import MECHANISMS

SASL_DIR_NAME = "sasl"
ADMIN_USER = "admin"
ADMIN_PRINCIPAL = f"User:{ADMIN_USER}"
ADMIN_PROPERTIES = "admin.properties"
# The user brokers authenticate as on each other's INTERNAL listeners (a super user:
# leaders take follower fetches only with CLUSTER_ACTION, broker/security/inter_broker.py).
BROKER_USER = "broker"
BROKER_PRINCIPAL = f"User:{BROKER_USER}"
BROKER_PROPERTIES = "broker.properties"


def broker_flags(mechanisms: tuple[str, ...], authorizer: str, super_users: str,
                 credentials_file: str) -> list[str]:
    """A broker's: its listeners' security, and the brokers' own user (a super user, so
    it has CLUSTER_ACTION) as it authenticates to the controller and on the other
    brokers' INTERNAL listeners."""
    return [*security_flags(mechanisms, authorizer, super_users),
            "--controller-sasl-config", credentials_file,
            "--set", f"inter.broker.credentials.file={credentials_file}"]


def controller_flags(mechanisms: tuple[str, ...], authorizer: str, super_users: str,
                     *user_configs: str) -> list[str]:
    """The controller's: the same security as the brokers, and the users created at its
    start-up from their properties (the admin, the brokers' user: no one could
    authenticate to create them)."""
    flags = security_flags(mechanisms, authorizer, super_users)
    for config in user_configs:
        flags += ["--bootstrap-user-config", config]
    return flags


def security_flags(mechanisms: tuple[str, ...], authorizer: str, super_users: str) -> list[str]:
    users = ";".join(u for u in [ADMIN_PRINCIPAL, BROKER_PRINCIPAL, *super_users.split(";")]
                     if u.strip())
    flags = ["--authorizer", authorizer, "--super-users", users]
    if mechanisms:
        flags += ["--sasl-mechanisms", ",".join(mechanisms)]
    return flags


def client_mechanism(mechanisms: tuple[str, ...]) -> str:
    """The strongest mechanism the brokers take (a client config names one)."""
    for preferred in ("SCRAM-SHA-512", "SCRAM-SHA-256", "PLAIN"):
        if preferred in mechanisms:
            return preferred
    return "SCRAM-SHA-512"


class SaslEntry(TypedDict):
    """The manifest's ``sasl`` entry: the super user, its mechanism, its properties file."""

    username: str
    mechanism: str
    command_config: str


def broker_properties(data_dir: Path) -> Path:
    """Write (or keep) the brokers' own credentials (``inter.broker.credentials.file``,
    mode 0600); returns its path."""
    directory = data_dir / SASL_DIR_NAME
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / BROKER_PROPERTIES
    password = (read_password(str(path)) if path.exists() else None) or secrets.token_urlsafe(24)
    lines = ["# The user brokers fetch from each other as (inter.broker.credentials.file)",
             f"sasl.username={BROKER_USER}", f"sasl.password={password}"]
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write("\n".join(lines) + "\n")
    return path.resolve()


def admin_properties(data_dir: Path, mechanisms: tuple[str, ...], *, ca: str | None) -> SaslEntry:
    """Write (or read back) the admin's client properties; returns the manifest's ``sasl``
    entry: {"username", "mechanism", "command_config"} (the password stays in the 0600
    file: ``cluster.json`` is readable by anyone)."""
    directory = data_dir / SASL_DIR_NAME
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / ADMIN_PROPERTIES
    password = (read_password(str(path)) if path.exists() else None) or secrets.token_urlsafe(24)
    mechanism = client_mechanism(mechanisms)
    protocol = "SASL_SSL" if ca else "SASL_PLAINTEXT"
    lines = ["# Kafka client settings of this cluster's super user (tide --command-config)",
             f"security.protocol={protocol}", f"sasl.mechanism={mechanism}",
             f"sasl.username={ADMIN_USER}", f"sasl.password={password}"]
    if ca:
        lines.append(f"ssl.ca.location={ca}")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write("\n".join(lines) + "\n")
    return {"username": ADMIN_USER, "mechanism": mechanism,
            "command_config": str(path.resolve())}


def read_password(command_config: str) -> str | None:
    """``sasl.password`` of a properties file this module wrote."""
    for line in Path(command_config).read_text().splitlines():
        if line.startswith("sasl.password="):
            return line.partition("=")[2]
    return None


def scram_mechanisms(mechanisms: tuple[str, ...]) -> list[str]:
    """The SCRAM credentials a user gets (PLAIN checks against them): every SCRAM
    mechanism, so any enabled one works."""
    return sorted(MECHANISMS)
