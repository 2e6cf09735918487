"""`tide certs` (tools/certs.py): a CA, certificates it signs, key files only their owner reads."""

from __future__ import annotations

import datetime
import ipaddress
import stat
import subprocess
import sys

import pytest
from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric import ec

from tidewater.proto.tls import CONTROLLER_ROLE_HOST
from tidewater.tools import certs

NOW = datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC)


def _verify(ca_pem: bytes, cert_pem: bytes) -> None:
    """Raises unless ``cert_pem`` is signed by ``ca_pem``'s key."""
    ca = x509.load_pem_x509_certificate(ca_pem)
    cert = x509.load_pem_x509_certificate(cert_pem)
    cert.verify_directly_issued_by(ca)


def test_issued_certificate_names_its_role_and_hosts_and_chains_to_the_ca():
    ca = certs.make_ca(now=NOW)
    issued = certs.issue(ca, name="broker-3", role="broker", hosts=("10.0.0.3", "b3.example"),
                         now=NOW)
    _verify(ca.cert_pem, issued.cert_pem)
    assert certs.subject_of(issued.cert_pem) == {"CN": "broker-3", "OU": "broker"}
    cert = x509.load_pem_x509_certificate(issued.cert_pem)
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert san.get_values_for_type(x509.IPAddress) == [ipaddress.ip_address("10.0.0.3")]
    assert san.get_values_for_type(x509.DNSName) == ["b3.example"]
    assert not cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    assert cert.not_valid_before_utc < NOW < cert.not_valid_after_utc


def test_default_hosts_are_loopback_and_localhost():
    ca = certs.make_ca(now=NOW)
    cert = x509.load_pem_x509_certificate(certs.issue(ca, name="c", role="client", now=NOW).cert_pem)
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert san.get_values_for_type(x509.IPAddress) == [ipaddress.ip_address("127.0.0.1")]
    assert san.get_values_for_type(x509.DNSName) == ["localhost"]


def test_a_certificate_of_another_ca_does_not_verify():
    issued = certs.issue(certs.make_ca(now=NOW), name="broker-1", role="broker", now=NOW)
    with pytest.raises(InvalidSignature):
        _verify(certs.make_ca(now=NOW).cert_pem, issued.cert_pem)


@pytest.mark.parametrize("name, role", [("x", "admin"), ("a,b", "broker"), ("", "client"),
                                        ("../x", "client"), (" x", "client")])
def test_bad_names_and_roles_are_refused(name, role):
    with pytest.raises(certs.CertError):
        certs.issue(certs.make_ca(now=NOW), name=name, role=role, now=NOW)


def test_ca_dir_keys_are_0600_and_an_existing_ca_is_kept(tmp_path):
    certs.init_ca_dir(tmp_path, now=NOW)
    ca_pem = (tmp_path / "ca.pem").read_bytes()
    with pytest.raises(certs.CertError, match="already holds a CA"):
        certs.init_ca_dir(tmp_path, now=NOW)
    assert (tmp_path / "ca.pem").read_bytes() == ca_pem
    cert_path, key_path = certs.issue_to_dir(tmp_path, name="controller", role="controller",
                                             now=NOW)
    for key in (tmp_path / "ca.key", key_path):
        assert stat.S_IMODE(key.stat().st_mode) == 0o600, key
    _verify(ca_pem, cert_path.read_bytes())
    from cryptography.hazmat.primitives import serialization
    key = serialization.load_pem_private_key(key_path.read_bytes(), password=None)
    assert isinstance(key, ec.EllipticCurvePrivateKey)
    with pytest.raises(certs.CertError):
        certs.issue_to_dir(tmp_path, name="ca", role="client", now=NOW)


def test_issue_without_a_ca_says_so(tmp_path):
    with pytest.raises(certs.CertError, match="tide certs init"):
        certs.issue_to_dir(tmp_path, name="broker-1", role="broker", now=NOW)


def test_cli_init_and_issue(tmp_path):
    def tide(*args):
        return subprocess.run([sys.executable, "-m", "tidewater.tools", "certs", *args],
                              capture_output=True, text=True, timeout=60)

    assert tide("init", "--dir", str(tmp_path)).returncode == 0
    result = tide("issue", "--dir", str(tmp_path), "--name", "broker-7", "--role", "broker",
                  "--host", "10.1.2.3", "--host", "kafka-7")
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == [str(tmp_path / "broker-7.pem"), str(tmp_path / "broker-7.key")]
    assert stat.S_IMODE((tmp_path / "broker-7.key").stat().st_mode) == 0o600
    assert certs.subject_of((tmp_path / "broker-7.pem").read_bytes()) == {"CN": "broker-7",
                                                                          "OU": "broker"}
    again = tide("init", "--dir", str(tmp_path))
    assert again.returncode == 1 and again.stderr.startswith("tide: certs init:"), again.stderr
    bad = tide("issue", "--dir", str(tmp_path), "--name", "x", "--role", "admin")
    assert bad.returncode == 2


def test_cli_cluster_makes_every_member_and_keeps_what_is_there(tmp_path):
    def hosts_of(name: str) -> set[str]:
        cert = x509.load_pem_x509_certificate((tmp_path / f"{name}.pem").read_bytes())
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        return {str(v) for v in san.get_values_for_type(x509.DNSName)} | {
            str(v) for v in san.get_values_for_type(x509.IPAddress)}

    run = [sys.executable, "-m", "tidewater.tools", "certs", "cluster", "--dir", str(tmp_path),
           "--brokers", "2", "--names-as-hosts"]
    made = subprocess.run(run, capture_output=True, text=True, timeout=60)
    assert made.returncode == 0, made.stderr
    assert made.stdout.strip() == str((tmp_path / "client.properties").resolve())
    assert hosts_of("broker-2") == {"broker-2", "localhost", "127.0.0.1"}
    assert hosts_of("controller") == {"controller", "localhost", "127.0.0.1",
                                      CONTROLLER_ROLE_HOST}
    assert hosts_of("client") == {"localhost", "127.0.0.1"}
    assert certs.subject_of((tmp_path / "broker-1.pem").read_bytes()) == {"CN": "broker-1",
                                                                          "OU": "broker"}
    properties = (tmp_path / "client.properties").read_text()
    assert "security.protocol=SSL" in properties and str(tmp_path / "client.key") in properties
    ca_before = (tmp_path / "ca.pem").read_bytes()
    again = subprocess.run(run, capture_output=True, text=True, timeout=60)
    assert again.returncode == 0 and (tmp_path / "ca.pem").read_bytes() == ca_before


@pytest.mark.timeout(30)
def test_members_serve_and_connect_but_a_client_certificate_only_connects(tmp_path):
    from cryptography.x509.oid import ExtendedKeyUsageOID as Eku

    def usages(name: str) -> set[x509.ObjectIdentifier]:
        cert = x509.load_pem_x509_certificate((tmp_path / f"{name}.pem").read_bytes())
        return set(cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value)

    def dns_names(name: str) -> list[str]:
        cert = x509.load_pem_x509_certificate((tmp_path / f"{name}.pem").read_bytes())
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        return san.get_values_for_type(x509.DNSName)

    certs.make_cluster_dir(tmp_path, [1, 2], names_as_hosts=True, now=NOW)
    assert usages("client") == {Eku.CLIENT_AUTH}
    for member in ("controller", "broker-1", "broker-2"):
        assert usages(member) == {Eku.SERVER_AUTH, Eku.CLIENT_AUTH}, member
        assert member in dns_names(member)  # serves as its own (compose) name
    assert "client" not in dns_names("client")
    assert not (tmp_path / "controller-2.pem").exists()  # one controller unless asked


@pytest.mark.timeout(30)
def test_a_quorum_gets_a_certificate_per_controller(tmp_path):
    certs.make_cluster_dir(tmp_path, [1], names_as_hosts=True, controllers=3, now=NOW)
    for name in ("controller", "controller-2", "controller-3"):
        pem = (tmp_path / f"{name}.pem").read_bytes()
        assert certs.subject_of(pem) == {"CN": name, "OU": "controller"}
        san = x509.load_pem_x509_certificate(pem).extensions.get_extension_for_class(
            x509.SubjectAlternativeName).value
        assert name in san.get_values_for_type(x509.DNSName)
        assert CONTROLLER_ROLE_HOST in san.get_values_for_type(x509.DNSName)
        assert (tmp_path / f"{name}.key").stat().st_mode & 0o077 == 0
    for name in ("broker-1", "client"):
        san = x509.load_pem_x509_certificate((tmp_path / f"{name}.pem").read_bytes()
                                             ).extensions.get_extension_for_class(
            x509.SubjectAlternativeName).value
        assert CONTROLLER_ROLE_HOST not in san.get_values_for_type(x509.DNSName)


@pytest.mark.timeout(30)
def test_a_controller_certificate_from_before_the_role_name_is_issued_again(tmp_path):
    """Brokers check CONTROLLER_ROLE_HOST: a kept controller certificate without it
    would lock them out, so ``make_cluster_dir`` replaces it (the others are kept)."""
    certs.init_ca_dir(tmp_path, now=NOW)
    ca = certs.read_ca_dir(tmp_path)
    old = certs.issue(ca, name="controller", role="broker", hosts=("127.0.0.1",), now=NOW)
    certs.write_public(tmp_path / "controller.pem", old.cert_pem)  # stands in for an old one
    certs.write_private(tmp_path / "controller.key", old.key_pem)
    assert certs.needs_issuing(tmp_path, "controller", "controller")
    certs.make_cluster_dir(tmp_path, [1], now=NOW)
    assert (tmp_path / "controller.pem").read_bytes() != old.cert_pem
    assert not certs.needs_issuing(tmp_path, "controller", "controller")
    broker_pem = (tmp_path / "broker-1.pem").read_bytes()
    certs.make_cluster_dir(tmp_path, [1], now=NOW)
    assert (tmp_path / "broker-1.pem").read_bytes() == broker_pem
