"""SCRAM and SASL/PLAIN message logic (proto/scram.py), against RFC 7677's test vector."""

import base64
import hashlib
import hmac

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tidewater.proto.scram import (
    SaslAuthenticationError,
    ScramClient,
    ScramServer,
    escape_name,
    make_credential,
    parse_plain,
    password_matches,
    unescape_name,
)

pytestmark = pytest.mark.timeout(60)

# RFC 7677 section 3.
RFC_SALT = base64.b64decode("W22ZaJ0SNY7soEsUEjb6gQ==")
RFC_CLIENT_FIRST = b"n,,n=user,r=rOprNGfwEbeRWgbNEkqO"
RFC_SERVER_NONCE = "%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0"
RFC_SERVER_FIRST = (b"r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,"
                    b"s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096")
RFC_CLIENT_FINAL = (b"c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,"
                    b"p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ=")
RFC_SERVER_FINAL = b"v=6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4="


def rfc_credential():
    return make_credential("SCRAM-SHA-256", "pencil", iterations=4096, salt=RFC_SALT)


def test_server_answers_rfc7677_vector():
    credential = rfc_credential()
    server = ScramServer("SCRAM-SHA-256", lambda user, mech: credential if user == "user" else None,
                         nonce=lambda: RFC_SERVER_NONCE)
    assert server.first(RFC_CLIENT_FIRST) == RFC_SERVER_FIRST
    assert server.final(RFC_CLIENT_FINAL) == RFC_SERVER_FINAL
    assert server.user == "user"


def test_client_sends_rfc7677_vector():
    client = ScramClient("SCRAM-SHA-256", "user", "pencil", nonce=lambda: "rOprNGfwEbeRWgbNEkqO")
    assert client.first() == RFC_CLIENT_FIRST
    assert client.final(RFC_SERVER_FIRST) == RFC_CLIENT_FINAL
    client.check(RFC_SERVER_FINAL)
    with pytest.raises(SaslAuthenticationError):
        client.check(b"v=AAAA")


def test_credential_keeps_no_password():
    credential = rfc_credential()
    assert b"pencil" not in repr(credential).encode()
    assert password_matches(credential, "pencil")
    assert not password_matches(credential, "pencil2")


def exchange(mechanism, stored_password, given_password, user="alice"):
    credential = make_credential(mechanism, stored_password)
    server = ScramServer(mechanism, lambda u, m: credential if (u, m) == ("alice", mechanism)
                         else None)
    client = ScramClient(mechanism, user, given_password)
    server_first = server.first(client.first())
    client.check(server.final(client.final(server_first)))
    return server.user


@pytest.mark.parametrize("mechanism", ["SCRAM-SHA-256", "SCRAM-SHA-512"])
def test_round_trip_and_wrong_password(mechanism):
    assert exchange(mechanism, "s3cret", "s3cret") == "alice"
    with pytest.raises(SaslAuthenticationError, match="authentication failed"):
        exchange(mechanism, "s3cret", "wrong")


def test_unknown_user_fails_only_at_the_end_and_looks_like_a_real_one():
    credential = make_credential("SCRAM-SHA-256", "x")
    server = ScramServer("SCRAM-SHA-256", lambda u, m: credential if u == "alice" else None)
    answer = server.first(b"n,,n=mallory,r=abc").decode()
    assert answer.startswith("r=abc") and ",s=" in answer and answer.endswith(",i=4096")
    again = ScramServer("SCRAM-SHA-256", lambda u, m: None).first(b"n,,n=mallory,r=abc").decode()
    assert again.split(",")[1] == answer.split(",")[1]  # the same fake salt each time
    client = ScramClient("SCRAM-SHA-256", "mallory", "x")
    with pytest.raises(SaslAuthenticationError):
        server.final(client.final(answer.encode()))


def test_librdkafka_2_0_nonce_with_the_client_nonce_repeated_in_front_is_taken():
    """Debian's kcat (librdkafka 2.0.2) sends r=<client nonce><full nonce>; Kafka's server
    checks endsWith, so we do too. The proof is over what the client sent."""
    credential = make_credential("SCRAM-SHA-256", "pw", salt=b"salt")
    server = ScramServer("SCRAM-SHA-256", lambda u, m: credential, nonce=lambda: "SRV")
    server_first = server.first(b"n,,n=alice,r=abc")
    assert server_first == b"r=abcSRV,s=" + base64.b64encode(b"salt") + b",i=4096"
    without_proof = b"c=biws,r=abcabcSRV"
    salted = hashlib.pbkdf2_hmac("sha256", b"pw", b"salt", 4096)
    client_key = hmac.new(salted, b"Client Key", "sha256").digest()
    auth = b"n=alice,r=abc," + server_first + b"," + without_proof
    signature = hmac.new(hashlib.sha256(client_key).digest(), auth, "sha256").digest()
    proof = bytes(x ^ y for x, y in zip(client_key, signature, strict=True))
    assert server.final(without_proof + b",p=" + base64.b64encode(proof)).startswith(b"v=")
    assert server.user == "alice"


def test_replayed_or_mismatched_nonce_is_refused():
    credential = make_credential("SCRAM-SHA-256", "pw")
    server = ScramServer("SCRAM-SHA-256", lambda u, m: credential)
    server.first(b"n,,n=alice,r=abc")
    with pytest.raises(SaslAuthenticationError, match="nonce"):
        server.final(b"c=biws,r=abcOTHER,p=AAAA")


@pytest.mark.parametrize("first", [
    b"", b"\xff\xfe", b"y,,n=a,r=b", b"p=tls-unique,,n=a,r=b", b"n,,", b"n,,n=a", b"n,,r=b",
    b"n,,n=a,r=b,m=ext", b"n,,n=a=ZZ,r=b", b"n,a=other,n=a,r=b", b"n,,n=,r=b", b"n,,n=a,n=a,r=b",
    b"n,,garbage",
])
def test_malformed_client_first_is_a_typed_error(first):
    server = ScramServer("SCRAM-SHA-512", lambda u, m: None)
    with pytest.raises(SaslAuthenticationError):
        server.first(first)


def test_final_before_first_is_refused():
    with pytest.raises(SaslAuthenticationError):
        ScramServer("SCRAM-SHA-512", lambda u, m: None).final(b"c=biws,r=x,p=AAAA")


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=200), st.binary(max_size=200))
def test_any_bytes_give_a_typed_error_or_an_answer(first, final):
    credential = make_credential("SCRAM-SHA-256", "pw")
    server = ScramServer("SCRAM-SHA-256", lambda u, m: credential)
    try:
        server.first(first)
        server.final(final)
    except SaslAuthenticationError:
        return
    raise AssertionError("random bytes authenticated")


@given(st.text(max_size=30))
def test_name_escaping_round_trips(name):
    escaped = escape_name(name)
    assert "," not in escaped
    assert unescape_name(escaped) == name


def test_plain_parsing():
    assert parse_plain(b"\0alice\0pw") == ("alice", "pw")
    assert parse_plain(b"alice\0alice\0pw") == ("alice", "pw")
    for bad in (b"alice\0pw", b"\0\0pw", b"\0alice\0", b"bob\0alice\0pw", b"\0a\0b\0c",
                b"\0\xff\0pw"):
        with pytest.raises(SaslAuthenticationError):
            parse_plain(bad)


def test_iterations_bounds():
    with pytest.raises(ValueError):
        make_credential("SCRAM-SHA-256", "pw", iterations=100)
    with pytest.raises(SaslAuthenticationError):
        make_credential("SCRAM-SHA-1", "pw")
