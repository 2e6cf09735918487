"""Clients' SASL settings (client/security.py): Kafka's names, refusals, call metadata."""

import pytest

from tidewater.client.security import (
    ClientSecurity,
    SecurityConfigError,
    parse_properties,
    properties_security,
    sync_channel,
)

pytestmark = pytest.mark.timeout(30)


def test_properties_file_with_sasl_ssl():
    security = properties_security(parse_properties(
        "security.protocol=SASL_SSL\nsasl.mechanism=SCRAM-SHA-512\nsasl.username=alice\n"
        "sasl.password=s3cret\nssl.ca.location=/ca.pem\n"))
    assert security.tls and security.cafile == "/ca.pem"
    assert (security.sasl_mechanism, security.sasl_username) == ("SCRAM-SHA-512", "alice")
    assert "s3cret" not in repr(security)
    # SCRAM: no password in any call's metadata; each channel gets its own SCRAM login.
    assert security.call_metadata() == ()
    login = security.scram_login()
    assert login is not None and login.mechanism == "SCRAM-SHA-512"
    assert security.scram_login() is not login


def test_plain_sends_the_password_as_metadata_and_has_no_scram_login():
    security = ClientSecurity.from_options("SASL_SSL", sasl_mechanism="PLAIN",
                                           sasl_plain_username="a", sasl_plain_password="b")
    ((key, value),) = security.call_metadata()
    assert key == "authorization" and value.startswith("PLAIN ")
    assert security.scram_login() is None


def test_sasl_plaintext_is_not_tls_and_plain_security_sends_nothing():
    security = ClientSecurity.from_options("SASL_PLAINTEXT", sasl_plain_username="a",
                                           sasl_plain_password="b")
    assert not security.tls and security.sasl_mechanism == "PLAIN"
    assert ClientSecurity.from_options("SSL").call_metadata() == ()


@pytest.mark.parametrize("options", [
    dict(security_protocol="SASL_SSL"),  # no user
    dict(security_protocol="SASL_SSL", sasl_plain_username="a"),  # no password
    dict(security_protocol="SASL_SSL", sasl_mechanism="GSSAPI", sasl_plain_username="a",
         sasl_plain_password="b"),
    dict(security_protocol="SSL", sasl_plain_username="a", sasl_plain_password="b"),
    dict(security_protocol="SASL_PLAINTEXT", ssl_cafile="/ca", sasl_plain_username="a",
         sasl_plain_password="b"),
])
def test_contradictory_or_incomplete_settings_are_refused(options):
    with pytest.raises(SecurityConfigError):
        ClientSecurity.from_options(**options)


def test_plain_over_a_plaintext_channel_warns_and_scram_does_not(caplog):
    def warnings_of(security: ClientSecurity) -> list[str]:
        caplog.clear()
        with caplog.at_level("WARNING", logger="tidewater.client.security"):
            sync_channel("127.0.0.1:1", security, ()).close()
        return [r.getMessage() for r in caplog.records]
    plain = ClientSecurity.from_options("SASL_PLAINTEXT", sasl_mechanism="PLAIN",
                                        sasl_plain_username="a", sasl_plain_password="b")
    scram = ClientSecurity.from_options("SASL_PLAINTEXT", sasl_mechanism="SCRAM-SHA-512",
                                        sasl_plain_username="a", sasl_plain_password="b")
    assert any("password crosses the network in clear" in m for m in warnings_of(plain))
    assert warnings_of(scram) == []
