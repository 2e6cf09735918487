"""TLS for every Tidewater listener and channel: files, credentials, principals.

One ``TlsFiles`` (a CA certificate, a certificate and its key, PEM) configures
a process. Servers and channels are made from it by the callers
(``broker/servicers/grpc_server.py``, ``controller/server.py``, the channels): this module
only turns files into gRPC credentials or an ``ssl.SSLContext`` and reads the
peer's identity back, so the rules about who may do what stay pure functions
in ``broker/replication/control_rules.py`` and ``controller/authorization.py``.

Principals: a peer's certificate subject ``CN=<name>, OU=<role>`` (the
convention of ``tide certs``, ``tools/certs.py``) becomes ``Principal(name,
role)``; gRPC gives it in ``context.auth_context()`` as ``x509_common_name``
and ``x509_subject`` (RFC 2253, e.g. ``OU=broker,CN=broker-1``). A broker's
name is ``broker-<id>`` (``broker_id_of``). On a plaintext connection, or a
TLS one without a client certificate, there is no principal (None).
"""

from __future__ import annotations

import argparse
import os
import ssl
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tidewater.proto.errors import InvalidConfigError

if TYPE_CHECKING:
    import grpc

# grpc is imported inside the functions that need it: the broker's and the controller's
# configs import this module before ``proto/grpc_env.apply()`` has set gRPC's environment,
# which must happen before anything imports grpc.

BROKER_NAME_PREFIX = "broker-"
ROLE_BROKER = "broker"
ROLE_CONTROLLER = "controller"
ROLE_CLIENT = "client"
# A DNS name every controller certificate serves as (``tools/certs.py``) and no other
# role's does: a broker's channel to the controller checks it instead of the address
# dialled (``controller_channel_options``), so only a controller certificate of the
# cluster's CA passes that handshake.
CONTROLLER_ROLE_HOST = "controller.role.tidewater"


class TlsConfigError(InvalidConfigError):
    """TLS files that are missing, unreadable, or given only in part."""


@dataclass(frozen=True)
class TlsMaterial:
    """The PEM bytes of a process's TLS identity and the CA it trusts."""

    ca_pem: bytes
    cert_pem: bytes | None
    key_pem: bytes | None


@dataclass(frozen=True)
class TlsFiles:
    """``--tls-ca``, ``--tls-cert``, ``--tls-key``: read once at start-up (``load``)."""

    ca: Path
    cert: Path | None
    key: Path | None

    @classmethod
    def from_flags(cls, ca: str | None, cert: str | None, key: str | None,
                   *, need_cert: bool = True) -> TlsFiles | None:
        """None when no flag is given (plaintext); all three (or, for a client, the CA and
        an optional certificate with its key) or a ``TlsConfigError``."""
        if ca is None and cert is None and key is None:
            return None
        if ca is None:
            raise TlsConfigError("TLS needs the CA certificate (--tls-ca)")
        if (cert is None) != (key is None):
            raise TlsConfigError("a TLS certificate needs its key and a key its certificate "
                                 "(--tls-cert with --tls-key)")
        if need_cert and cert is None:
            raise TlsConfigError("a server needs its own certificate (--tls-cert, --tls-key)")
        return cls(Path(ca), Path(cert) if cert else None, Path(key) if key else None)

    def load(self) -> TlsMaterial:
        def read(path: Path | None) -> bytes | None:
            if path is None:
                return None
            try:
                return path.read_bytes()
            except OSError as e:
                raise TlsConfigError(f"cannot read {path}: {e.strerror}") from None

        ca = read(self.ca)
        assert ca is not None
        return TlsMaterial(ca, read(self.cert), read(self.key))


def server_credentials(material: TlsMaterial, *,
                       require_client_auth: bool) -> grpc.ServerCredentials:
    """A gRPC listener's credentials. ``require_client_auth``: the handshake fails without
    a client certificate signed by the CA (cluster members' listeners)."""
    import grpc

    assert material.cert_pem is not None and material.key_pem is not None
    return grpc.ssl_server_credentials([(material.key_pem, material.cert_pem)],
                                       root_certificates=material.ca_pem,
                                       require_client_auth=require_client_auth)


def channel_credentials(material: TlsMaterial) -> grpc.ChannelCredentials:
    """A channel that trusts only the CA and presents the certificate, when there is one."""
    import grpc

    return grpc.ssl_channel_credentials(root_certificates=material.ca_pem,
                                        private_key=material.key_pem,
                                        certificate_chain=material.cert_pem)


def controller_channel_options() -> list[tuple[str, str]]:
    """For a TLS channel to a controller: the server's certificate must name
    ``CONTROLLER_ROLE_HOST`` (gRPC's ``ssl_target_name_override`` is the name checked;
    gRPC Python has no hook to check the certificate's OU itself)."""
    return [("grpc.ssl_target_name_override", CONTROLLER_ROLE_HOST)]


def open_aio_channel(target: str, options: Sequence[tuple[str, int | str]],
                     credentials: grpc.ChannelCredentials | None,
                     interceptors: Sequence[Any] | None = None) -> grpc.aio.Channel:
    """An aio channel to ``target``: TLS with ``credentials``, else plaintext (the one
    place the brokers, the controller and the clients choose between the two);
    ``interceptors``: aio client interceptors (a client's SASL call metadata)."""
    import grpc

    if credentials is None:
        return grpc.aio.insecure_channel(target, options=options, interceptors=interceptors)
    return grpc.aio.secure_channel(target, credentials, options=options,
                                   interceptors=interceptors)


def server_ssl_context(files: TlsFiles) -> ssl.SSLContext:
    """For the Kafka listener (asyncio TCP): TLS 1.2+; a client certificate is asked for
    but not required (Kafka's ``ssl.client.auth=requested``): one from the cluster's CA
    names the connection's principal, any other fails the handshake."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        assert files.cert is not None and files.key is not None
        context.load_cert_chain(files.cert, files.key)
        context.load_verify_locations(cafile=files.ca)
    except (OSError, ssl.SSLError) as e:
        raise TlsConfigError(f"cannot load the TLS files: {e}") from None
    context.verify_mode = ssl.CERT_OPTIONAL
    return context


# ---------------------------------------------------------------------- principals


@dataclass(frozen=True)
class Principal:
    """Who is on the other end of a mutual-TLS connection: the certificate's CN and OU."""

    name: str
    role: str


def _rdns(subject: str) -> dict[str, str]:
    """``OU=broker,CN=broker-1`` (RFC 2253, ``\\,`` escapes) -> {'OU': 'broker', ...}; the
    first value of a repeated attribute wins."""
    parts: list[str] = []
    current: list[str] = []
    escaped = False
    for c in subject:
        if escaped:
            current.append(c)
            escaped = False
        elif c == "\\":
            escaped = True
        elif c in ",+":
            parts.append("".join(current))
            current = []
        else:
            current.append(c)
    parts.append("".join(current))
    out: dict[str, str] = {}
    for part in parts:
        key, sep, value = part.partition("=")
        if sep:
            out.setdefault(key.strip().upper(), value.strip())
    return out


def principal_of(auth_context: Mapping[str, Sequence[bytes]]) -> Principal | None:
    """The peer's principal from gRPC's ``context.auth_context()``; None without a
    verified client certificate (plaintext, or TLS without client authentication)."""
    names = auth_context.get("x509_common_name")
    if not names:
        return None
    subjects = auth_context.get("x509_subject") or [b""]
    rdns = _rdns(subjects[0].decode(errors="replace"))
    return Principal(names[0].decode(errors="replace"), rdns.get("OU", ""))


def broker_id_of(principal: Principal) -> int | None:
    """The broker id a broker principal names (``broker-<id>``); None for any other."""
    if principal.role != ROLE_BROKER or not principal.name.startswith(BROKER_NAME_PREFIX):
        return None
    digits = principal.name[len(BROKER_NAME_PREFIX):]
    if not digits.isdigit() or (len(digits) > 1 and digits[0] == "0"):
        return None
    return int(digits)


# Environment variables giving --tls-ca/--tls-cert/--tls-key their defaults: a compose
# file's TLS override sets them without repeating each service's command.
TLS_ENV = {"tls_ca": "TIDE_TLS_CA", "tls_cert": "TIDE_TLS_CERT", "tls_key": "TIDE_TLS_KEY"}


def add_tls_arguments(parser: argparse.ArgumentParser,
                      environ: Mapping[str, str] = os.environ) -> None:
    """``--tls-ca``, ``--tls-cert``, ``--tls-key`` of the broker and the controller, each
    defaulting to its ``TLS_ENV`` variable when that is set and not empty."""
    group = parser.add_argument_group(
        "TLS", "all three, or none for plaintext. With them every listener speaks TLS only; "
        "cluster members' listeners (a broker's INTERNAL, the controller) also require a "
        "client certificate signed by the CA, and the process presents its own on its "
        "channels (make them with `tide certs`; a broker's CN is broker-<id>). Defaults: "
        "the environment variables TIDE_TLS_CA, TIDE_TLS_CERT, TIDE_TLS_KEY")
    for dest, help_text in (("tls_ca", "PEM CA certificate to trust"),
                            ("tls_cert", "PEM certificate of this process"),
                            ("tls_key", "PEM private key of --tls-cert")):
        group.add_argument("--" + dest.replace("_", "-"), dest=dest, metavar="FILE",
                           default=environ.get(TLS_ENV[dest]) or None, help=help_text)
