"""A cluster's certificate authority and the certificates it signs (``tide certs``).

Pure generation: functions take names and a clock and return PEM bytes; the
only I/O is ``write_private`` / ``write_public``, which the CLI and the local
cluster call. No openssl process is involved (the ``cryptography`` package).

Identity convention (what the servers' authorization rules read back, see
``proto/tls.py``): a certificate's subject is ``CN=<name>, OU=<role>`` with
role ``broker``, ``controller`` or ``client``. A broker's name is
``broker-<id>``: the controller takes a broker's registration, heartbeats,
AlterPartition and ReportCorruptReplica only from the broker certificate whose
CN names that broker id. Every certificate carries the hosts it may serve as
subjectAltNames (127.0.0.1 and localhost unless told otherwise), so one
certificate serves a process's listeners and is presented by its channels.

Keys are EC P-256 (small, fast handshakes, accepted by gRPC, OpenSSL and
librdkafka); the CA is valid 10 years, leaf certificates ``LEAF_DAYS``.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TypedDict

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from tidewater.proto.tls import CONTROLLER_ROLE_HOST, ROLE_CONTROLLER

ROLES = ("broker", "controller", "client")
DEFAULT_HOSTS = ("127.0.0.1", "localhost")
CA_DAYS = 3650
LEAF_DAYS = 825  # the longest validity TLS clients still accept for a server certificate
# Extended key usages by role: members serve and connect, clients only connect.
EKUS: dict[str, tuple[x509.ObjectIdentifier, ...]] = {
    "broker": (ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH),
    "controller": (ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH),
    "client": (ExtendedKeyUsageOID.CLIENT_AUTH,),
}
CA_CERT_FILE = "ca.pem"
CA_KEY_FILE = "ca.key"
# Certificates are backdated this much: a machine whose clock is a little behind the
# issuer's must not find a fresh certificate "not yet valid".
BACKDATE = datetime.timedelta(minutes=5)


class CertError(ValueError):
    """A name, role or host a certificate cannot be made with, or an unreadable CA."""


@dataclass(frozen=True)
class Issued:
    """PEM bytes of one certificate and its private key."""

    cert_pem: bytes
    key_pem: bytes


def _new_key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def _san(host: str) -> x509.GeneralName:
    try:
        return x509.IPAddress(ipaddress.ip_address(host))
    except ValueError:
        pass
    if not host or any(c.isspace() for c in host) or "/" in host:
        raise CertError(f"bad host {host!r}: expected an IP address or a DNS name")
    return x509.DNSName(host)


def make_ca(*, cluster_name: str = "tidewater", now: datetime.datetime) -> Issued:
    """A self-signed CA certificate (CN=<cluster_name> CA) that may sign leaf certificates only."""
    key = _new_key()
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"{cluster_name} CA"),
                      x509.NameAttribute(NameOID.ORGANIZATIONAL_UNIT_NAME, "ca")])
    cert = (x509.CertificateBuilder()
            .subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - BACKDATE)
            .not_valid_after(now + datetime.timedelta(days=CA_DAYS))
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True,
                                         crl_sign=True, content_commitment=False,
                                         key_encipherment=False, data_encipherment=False,
                                         key_agreement=False, encipher_only=False,
                                         decipher_only=False), critical=True)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()),
                           critical=False)
            .sign(key, hashes.SHA256()))
    return Issued(cert.public_bytes(serialization.Encoding.PEM), _key_pem(key))


def issue(ca: Issued, *, name: str, role: str, hosts: tuple[str, ...] = DEFAULT_HOSTS,
          now: datetime.datetime, days: int = LEAF_DAYS) -> Issued:
    """A certificate ``CN=<name>, OU=<role>`` for ``hosts``, signed by ``ca``.

    Extended key usage by role (``EKUS``): a cluster member's (broker, controller)
    serves TLS and is also presented on its own channels (serverAuth and clientAuth);
    a client's is clientAuth only, so a TLS client (gRPC, OpenSSL, librdkafka) refuses
    a server presenting it: a leaked client key cannot impersonate a member."""
    if role not in ROLES:
        raise CertError(f"bad role {role!r}: expected one of {', '.join(ROLES)}")
    if not name or any(c in name for c in ",=/\\") or name != name.strip():
        raise CertError(f"bad name {name!r}: no commas, '=', slashes or surrounding spaces")
    if not hosts:
        raise CertError("a certificate needs at least one host")
    if role == ROLE_CONTROLLER:  # only controllers serve as it: brokers' channels check it
        hosts = (*hosts, CONTROLLER_ROLE_HOST)
    try:
        ca_cert = x509.load_pem_x509_certificate(ca.cert_pem)
        ca_key = serialization.load_pem_private_key(ca.key_pem, password=None)
    except ValueError as e:
        raise CertError(f"cannot read the CA: {e}") from None
    key = _new_key()
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name),
                         x509.NameAttribute(NameOID.ORGANIZATIONAL_UNIT_NAME, role)])
    cert = (x509.CertificateBuilder()
            .subject_name(subject).issuer_name(ca_cert.subject).public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - BACKDATE)
            .not_valid_after(now + datetime.timedelta(days=days))
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.SubjectAlternativeName([_san(h) for h in dict.fromkeys(hosts)]),
                           critical=False)
            .add_extension(x509.ExtendedKeyUsage(list(EKUS[role])), critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(
                ca_cert.public_key()), critical=False)  # type: ignore[arg-type]
            .sign(ca_key, hashes.SHA256()))  # type: ignore[arg-type]
    return Issued(cert.public_bytes(serialization.Encoding.PEM), _key_pem(key))


def subject_of(cert_pem: bytes) -> dict[str, str]:
    """{'CN': ..., 'OU': ...} of a PEM certificate (for messages and tests)."""
    cert = x509.load_pem_x509_certificate(cert_pem)
    out = {}
    for oid, short in ((NameOID.COMMON_NAME, "CN"), (NameOID.ORGANIZATIONAL_UNIT_NAME, "OU")):
        attrs = cert.subject.get_attributes_for_oid(oid)
        if attrs:
            out[short] = str(attrs[0].value)
    return out


# ---------------------------------------------------------------------- files


def write_private(path: Path, data: bytes) -> None:
    """Write a key readable by its owner only (0600 from the start, never wider)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.fchmod(fd, 0o600)  # an existing file keeps its mode through O_CREAT
        os.write(fd, data)
    finally:
        os.close(fd)


def write_public(path: Path, data: bytes) -> None:
    path.write_bytes(data)


def init_ca_dir(directory: Path, *, now: datetime.datetime) -> Path:
    """Make ``ca.pem`` and ``ca.key`` in ``directory``; refuses to replace an existing CA
    (every certificate it signed would stop being trusted). Returns the CA cert's path."""
    directory.mkdir(parents=True, exist_ok=True)
    cert_path, key_path = directory / CA_CERT_FILE, directory / CA_KEY_FILE
    if cert_path.exists() or key_path.exists():
        raise CertError(f"{directory} already holds a CA ({CA_CERT_FILE}/{CA_KEY_FILE})")
    ca = make_ca(now=now)
    write_private(key_path, ca.key_pem)
    write_public(cert_path, ca.cert_pem)
    return cert_path


def read_ca_dir(directory: Path) -> Issued:
    try:
        return Issued((directory / CA_CERT_FILE).read_bytes(), (directory / CA_KEY_FILE).read_bytes())
    except OSError as e:
        raise CertError(f"no CA in {directory} ({e.strerror}); run `tide certs init` first") \
            from None


def needs_issuing(directory: Path, name: str, role: str) -> bool:
    """Are ``<name>.pem`` / ``<name>.key`` missing, or is it a controller certificate
    issued before controllers served as ``CONTROLLER_ROLE_HOST`` (brokers would refuse
    it)?"""
    cert_path = directory / f"{name}.pem"
    if not cert_path.exists() or not (directory / f"{name}.key").exists():
        return True
    if role != ROLE_CONTROLLER:
        return False
    try:
        cert = x509.load_pem_x509_certificate(cert_path.read_bytes())
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except (ValueError, x509.ExtensionNotFound):
        return True
    return CONTROLLER_ROLE_HOST not in san.get_values_for_type(x509.DNSName)


def issue_to_dir(directory: Path, *, name: str, role: str,
                 hosts: tuple[str, ...] = DEFAULT_HOSTS,
                 now: datetime.datetime) -> tuple[Path, Path]:
    """Issue ``<name>.pem`` and ``<name>.key`` in ``directory`` with its CA; returns their paths."""
    if name == "ca":
        raise CertError("the name 'ca' is the CA's own (ca.pem, ca.key)")
    issued = issue(read_ca_dir(directory), name=name, role=role, hosts=hosts, now=now)
    cert_path, key_path = directory / f"{name}.pem", directory / f"{name}.key"
    write_private(key_path, issued.key_pem)
    write_public(cert_path, issued.cert_pem)
    return cert_path, key_path


CLIENT_CERT_NAME = "client"
CLIENT_PROPERTIES_FILE = "client.properties"


class ClientTlsFiles(TypedDict):
    """What a client of a cluster needs for TLS (paths): ``make_cluster_dir``'s answer."""

    ca: str
    cert: str
    key: str
    command_config: str


def make_cluster_dir(directory: Path, broker_ids: list[int], *,
                     hosts: tuple[str, ...] = DEFAULT_HOSTS, names_as_hosts: bool = False,
                     controllers: int = 1, client_name: str = CLIENT_CERT_NAME,
                     now: datetime.datetime) -> ClientTlsFiles:
    """A cluster's CA and certificates in ``directory``: ``controller``, ``broker-<id>``
    for each id, ``client_name`` (role client); with ``controllers`` > 1 also
    ``controller-2``..``controller-<N>`` for the other nodes of a quorum (node 1 keeps
    ``controller``, the compose service's name; a ``controller-<id>`` certificate may
    send Raft messages only as node ``<id>``, ``controller.quorum.transport``); files
    already there are kept (a CA is never replaced).
    Each certificate serves ``hosts`` and, with ``names_as_hosts``, its own name too (a
    container's hostname on a compose network). Writes ``client.properties`` (Kafka
    client settings naming the client certificate) and returns its entries:
    ``{"ca", "cert", "key", "command_config"}``, paths as strings."""
    if not (directory / CA_CERT_FILE).exists():
        init_ca_dir(directory, now=now)
    wanted = [("controller", "controller")] + [
        (f"controller-{n}", "controller") for n in range(2, controllers + 1)] + [
        (f"broker-{i}", "broker") for i in broker_ids]
    wanted.append((client_name, "client"))
    for name, role in wanted:
        if needs_issuing(directory, name, role):
            own = (name,) if names_as_hosts and role != "client" else ()
            issue_to_dir(directory, name=name, role=role, hosts=hosts + own, now=now)
    ca, cert, key = (str(directory.resolve() / n) for n in (
        CA_CERT_FILE, f"{client_name}.pem", f"{client_name}.key"))
    properties = directory / CLIENT_PROPERTIES_FILE
    properties.write_text("# Kafka client settings for this cluster (tide --command-config)\n"
                          f"security.protocol=SSL\nssl.cafile={ca}\nssl.certfile={cert}\n"
                          f"ssl.keyfile={key}\n")
    return {"ca": ca, "cert": cert, "key": key, "command_config": str(properties.resolve())}
