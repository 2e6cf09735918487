"""How a client connects: plaintext or TLS, with Kafka's names for the settings.

``ClientSecurity`` is what ``Producer``, ``Consumer``, ``AdminClient`` and
``AsyncProducer`` take as ``security_protocol`` (``PLAINTEXT`` or ``SSL``),
``ssl_cafile`` (PEM CA certificates to trust; gRPC's default roots when
absent), ``ssl_certfile`` and ``ssl_keyfile`` (a client certificate, for
listeners that require one) — kafka-python's names. ``tide
--command-config FILE`` reads the same from a Kafka client properties file
(``properties_security``): ``security.protocol``, ``ssl.cafile`` or
``ssl.ca.location``, ``ssl.certfile`` or ``ssl.certificate.location``,
``ssl.keyfile`` or ``ssl.key.location``. Java keystores
(``ssl.truststore.*``, ``ssl.keystore.*``) are refused with a message: gRPC
reads PEM only.

A security value is hashable: channel pools keep it with their channels, so
clients with different settings never share a channel. Files are read when
the first channel needs them (``channel_credentials``, cached per value).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path

import grpc

from tidewater.proto.tls import open_aio_channel

PROTOCOLS = ("PLAINTEXT", "SSL")


class SecurityConfigError(ValueError):
    """Security settings a client cannot connect with (a caller's mistake, not retriable)."""


@dataclass(frozen=True, slots=True)
class ClientSecurity:
    protocol: str = "PLAINTEXT"
    cafile: str | None = None
    certfile: str | None = None
    keyfile: str | None = None

    @classmethod
    def from_options(cls, security_protocol: str = "PLAINTEXT", ssl_cafile: str | None = None,
                     ssl_certfile: str | None = None,
                     ssl_keyfile: str | None = None) -> ClientSecurity:
        protocol = (security_protocol or "PLAINTEXT").strip().upper()
        if protocol not in PROTOCOLS:
            raise SecurityConfigError(
                f"security_protocol {security_protocol!r} is not supported (PLAINTEXT or SSL; "
                "no SASL yet)")
        if protocol == "PLAINTEXT":
            if ssl_cafile or ssl_certfile or ssl_keyfile:
                raise SecurityConfigError("ssl_* settings need security_protocol='SSL'")
            return cls()
        if bool(ssl_certfile) != bool(ssl_keyfile):
            raise SecurityConfigError("ssl_certfile and ssl_keyfile go together")
        return cls("SSL", ssl_cafile or None, ssl_certfile or None, ssl_keyfile or None)

    @property
    def tls(self) -> bool:
        return self.protocol == "SSL"


PLAINTEXT = ClientSecurity()


def _read(path: str | None) -> bytes | None:
    if path is None:
        return None
    try:
        return Path(path).read_bytes()
    except OSError as e:
        raise SecurityConfigError(f"cannot read {path}: {e.strerror}") from None


@functools.lru_cache(maxsize=16)
def channel_credentials(security: ClientSecurity) -> grpc.ChannelCredentials | None:
    """The gRPC credentials of ``security``; None for plaintext."""
    if not security.tls:
        return None
    return grpc.ssl_channel_credentials(root_certificates=_read(security.cafile),
                                        private_key=_read(security.keyfile),
                                        certificate_chain=_read(security.certfile))


def sync_channel(target: str, security: ClientSecurity, options) -> grpc.Channel:
    credentials = channel_credentials(security)
    if credentials is None:
        return grpc.insecure_channel(target, options=options)
    return grpc.secure_channel(target, credentials, options=options)


def aio_channel(target: str, security: ClientSecurity, options) -> grpc.aio.Channel:
    return open_aio_channel(target, options, channel_credentials(security))


# ---------------------------------------------------------------------- Kafka properties files

# Kafka client property -> ClientSecurity.from_options argument (librdkafka and
# kafka-python names for the same thing).
_PROPERTY_NAMES = {
    "security.protocol": "security_protocol",
    "ssl.cafile": "ssl_cafile",
    "ssl.ca.location": "ssl_cafile",
    "ssl.certfile": "ssl_certfile",
    "ssl.certificate.location": "ssl_certfile",
    "ssl.keyfile": "ssl_keyfile",
    "ssl.key.location": "ssl_keyfile",
}


def parse_properties(text: str) -> dict[str, str]:
    """Java properties, the subset client configs use: ``key=value`` or ``key: value``
    lines, ``#`` and ``!`` comments, surrounding spaces dropped."""
    out: dict[str, str] = {}
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line[0] in "#!":
            continue
        cut = min((i for i in (line.find("="), line.find(":")) if i >= 0), default=-1)
        if cut <= 0:
            raise SecurityConfigError(f"line {number}: expected key=value, got {raw.strip()!r}")
        out[line[:cut].strip()] = line[cut + 1:].strip()
    return out


def properties_security(properties: dict[str, str]) -> ClientSecurity:
    """The security settings of a Kafka client properties file; other keys are ignored
    (a file written for Kafka's tools may hold producer or consumer settings)."""
    keystores = sorted(k for k in properties if k.startswith(("ssl.truststore.", "ssl.keystore.")))
    if keystores:
        raise SecurityConfigError(f"{', '.join(keystores)}: Java keystores are not read here; "
                                  "give PEM files (ssl.cafile, ssl.certfile, ssl.keyfile)")
    options: dict[str, str] = {}
    for key, value in properties.items():
        name = _PROPERTY_NAMES.get(key)
        if name is not None and value:
            options[name] = value
    return ClientSecurity.from_options(**options)
