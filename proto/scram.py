"""SCRAM (RFC 5802, RFC 7677) and SASL/PLAIN (RFC 4616): pure message logic, no I/O.

What a server keeps of a password (``ScramCredential``): the salt, the
iteration count and two keys, never the password:

    SaltedPassword = PBKDF2-HMAC-H(password, salt, iterations)
    StoredKey      = H(HMAC(SaltedPassword, "Client Key"))
    ServerKey      = HMAC(SaltedPassword, "Server Key")

The exchange (``ScramServer``), as Kafka runs it (no channel binding, so the
GS2 header is ``n,,``; ``a=`` names no other identity):

    client-first  n,,n=<user>,r=<client nonce>
    server-first  r=<client nonce><server nonce>,s=<salt b64>,i=<iterations>
    client-final  c=biws,r=<nonce>,p=<ClientProof b64>
    server-final  v=<ServerSignature b64>

ClientProof = ClientKey XOR HMAC(StoredKey, AuthMessage); the server checks
H(ClientProof XOR HMAC(StoredKey, AuthMessage)) == StoredKey. The client-final
nonce must end with the server-first one (Kafka's check; librdkafka 2.0 repeats
the client nonce in front). A user with no
credential is answered like a wrong password (``fake_credential``: a salt made
from the user name and a server secret, an iteration count drawn from the known
users' counts, so no user list leaks), checked with the same work and failing
only at the final step. The secret is this process's: a client comparing the
fake salts of two brokers, or of one broker across a restart, still sees them
differ where a real user's stay the same.

User names escape ``=`` and ``,`` as ``=3D`` and ``=2C``. Any message that
does not parse is a ``SaslAuthenticationError``: the caller refuses the
connection with SASL_AUTHENTICATION_FAILED.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from tidewater.proto import tidewater_pb2 as pb
from tidewater.proto.errors import InvariantViolation, TidewaterError

# Kafka's names; the hash each uses.
MECHANISMS: dict[str, str] = {"SCRAM-SHA-256": "sha256", "SCRAM-SHA-512": "sha512"}
ITERATIONS_MIN = 4096  # RFC 7677's floor, and Kafka's
ITERATIONS_MAX = 16384  # Kafka's ceiling (ScramMechanism.maxIterations)
NONCE_BYTES = 24
USER_NAME_BYTES_MAX = 255
PASSWORD_BYTES_MAX = 1024


class SaslAuthenticationError(TidewaterError):
    """Bad credentials or a malformed SASL message (SASL_AUTHENTICATION_FAILED)."""

    error_code = pb.SASL_AUTHENTICATION_FAILED


@dataclass(frozen=True, slots=True)
class ScramCredential:
    mechanism: str
    salt: bytes
    iterations: int
    stored_key: bytes
    server_key: bytes


def credential_to_pb(user: str, c: ScramCredential) -> pb.ScramCredential:
    return pb.ScramCredential(user=user, mechanism=c.mechanism, salt=c.salt,
                              iterations=c.iterations, stored_key=c.stored_key,
                              server_key=c.server_key)


def credential_from_pb(p: pb.ScramCredential) -> ScramCredential:
    return ScramCredential(p.mechanism, p.salt, p.iterations, p.stored_key, p.server_key)


def _hash(mechanism: str) -> str:
    try:
        return MECHANISMS[mechanism]
    except KeyError:
        raise SaslAuthenticationError(f"unknown SCRAM mechanism {mechanism!r}") from None


def _hmac(name: str, key: bytes, message: bytes) -> bytes:
    return hmac.new(key, message, name).digest()


def salted_password(mechanism: str, password: str, salt: bytes, iterations: int) -> bytes:
    return hashlib.pbkdf2_hmac(_hash(mechanism), password.encode(), salt, iterations)


def make_credential(mechanism: str, password: str, *, iterations: int = ITERATIONS_MIN,
                    salt: bytes | None = None) -> ScramCredential:
    """What the controller stores for ``password`` (a fresh random salt unless given)."""
    name = _hash(mechanism)
    if not ITERATIONS_MIN <= iterations <= ITERATIONS_MAX:
        raise ValueError(f"iterations {iterations} outside {ITERATIONS_MIN}..{ITERATIONS_MAX}")
    salt = os.urandom(32) if salt is None else salt
    salted = salted_password(mechanism, password, salt, iterations)
    client_key = _hmac(name, salted, b"Client Key")
    return ScramCredential(mechanism, salt, iterations,
                           hashlib.new(name, client_key).digest(),
                           _hmac(name, salted, b"Server Key"))


def password_matches(credential: ScramCredential, password: str) -> bool:
    """Does ``password`` give ``credential``'s StoredKey (SASL/PLAIN checks with this)?"""
    name = _hash(credential.mechanism)
    salted = salted_password(credential.mechanism, password, credential.salt,
                             credential.iterations)
    stored = hashlib.new(name, _hmac(name, salted, b"Client Key")).digest()
    return hmac.compare_digest(stored, credential.stored_key)


def escape_name(name: str) -> str:
    return name.replace("=", "=3D").replace(",", "=2C")


def unescape_name(text: str) -> str:
    out, i = [], 0
    while i < len(text):
        if text[i] == "=":
            code = text[i:i + 3]
            if code == "=3D":
                out.append("=")
            elif code == "=2C":
                out.append(",")
            else:
                raise SaslAuthenticationError(f"bad escape {code!r} in a SCRAM user name")
            i += 3
        else:
            out.append(text[i])
            i += 1
    return "".join(out)


def _attributes(message: str) -> dict[str, str]:
    """``k=v,k=v`` -> {k: v}; each key once, one letter."""
    out: dict[str, str] = {}
    for part in message.split(","):
        if len(part) < 2 or part[1] != "=" or not part[0].isalpha() or part[0] in out:
            raise SaslAuthenticationError(f"malformed SCRAM attribute {part[:40]!r}")
        out[part[0]] = part[2:]
    return out


def _b64decode(text: str, what: str) -> bytes:
    try:
        return base64.b64decode(text, validate=True)
    except ValueError:
        raise SaslAuthenticationError(f"{what} is not base64") from None


def _text(data: bytes) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise SaslAuthenticationError("SASL message is not UTF-8") from None


def new_nonce() -> str:
    """Printable random nonce text (no ``,``: base64 has none)."""
    return base64.b64encode(os.urandom(NONCE_BYTES)).decode()


# The fake credential of an unknown user: stable per user for this process (a secret
# made at start), so asking twice gives the same answer as for a real user.
_FAKE_SALT_SECRET = os.urandom(32)

CredentialLookup = Callable[[str, str], ScramCredential | None]  # (user, mechanism)
IterationsSeen = Callable[[str], Sequence[int]]  # mechanism -> known users' counts


def fake_credential(mechanism: str, user: str, iterations_seen: Sequence[int], *,
                    secret: bytes = _FAKE_SALT_SECRET) -> ScramCredential:
    """What an unknown user is answered and checked against, so that neither the SCRAM
    server-first nor the time a check takes tells it from a known one: a salt and keys
    from HMAC(secret, mechanism, user), and an iteration count picked by the same HMAC
    from the known users' counts of the mechanism (their distribution, stable per user;
    ITERATIONS_MIN when there are none). No password gives its StoredKey."""
    digest = hmac.new(secret, f"{mechanism}\0{user}".encode(), hashlib.sha512).digest()
    counts = sorted(iterations_seen)
    iterations = (counts[int.from_bytes(digest[32:40], "big") % len(counts)] if counts
                  else ITERATIONS_MIN)
    size = hashlib.new(_hash(mechanism)).digest_size
    keys = hmac.new(secret, b"keys\0" + digest, hashlib.sha512).digest()
    return ScramCredential(mechanism, digest[:32], iterations, keys[:size],
                           hmac.new(secret, b"server\0" + digest, _hash(mechanism)).digest())


class ScramServer:
    """One SCRAM exchange on the server side: ``first(client_first)`` -> server-first,
    ``final(client_final)`` -> server-final; ``user`` once ``final`` returned. Any
    failure raises SaslAuthenticationError (and the exchange is over)."""

    def __init__(self, mechanism: str, lookup: CredentialLookup, *,
                 nonce: Callable[[], str] = lambda: new_nonce(),
                 iterations_seen: IterationsSeen = lambda mechanism: ()):
        self.mechanism = mechanism
        self._iterations_seen = iterations_seen
        self._known = False
        self._hash = _hash(mechanism)
        self._lookup = lookup
        self._nonce = nonce
        self._credential: ScramCredential | None = None
        self._user = ""
        self._client_first_bare = ""
        self._server_first = ""
        self._nonce_text = ""
        self.user: str | None = None  # set when authenticated

    def first(self, data: bytes) -> bytes:
        message = _text(data)
        if not message.startswith("n,"):
            # "y," / "p=": channel binding, which Kafka never offers.
            raise SaslAuthenticationError("SCRAM: channel binding is not supported")
        authzid, sep, bare = message[2:].partition(",")
        if not sep:
            raise SaslAuthenticationError("SCRAM client-first has no bare message")
        attributes = _attributes(bare)
        if set(attributes) - {"n", "r", "m"} or "n" not in attributes or "r" not in attributes:
            raise SaslAuthenticationError("SCRAM client-first needs n= and r=")
        if "m" in attributes:
            raise SaslAuthenticationError("SCRAM extensions (m=) are not supported")
        user = unescape_name(attributes["n"])
        if authzid and authzid != f"a={escape_name(user)}":
            raise SaslAuthenticationError("SCRAM: authorization id differs from the user")
        if not user or len(user.encode()) > USER_NAME_BYTES_MAX or not attributes["r"]:
            raise SaslAuthenticationError("SCRAM client-first: empty or long user or nonce")
        self._user = user
        credential = self._lookup(user, self.mechanism)
        self._known = credential is not None
        if credential is None:  # checked like a real one at the end, and refused there
            credential = fake_credential(self.mechanism, user,
                                         self._iterations_seen(self.mechanism))
        self._credential = credential
        salt, iterations = credential.salt, credential.iterations
        self._client_first_bare = bare
        self._nonce_text = attributes["r"] + self._nonce()
        self._server_first = (f"r={self._nonce_text},s={base64.b64encode(salt).decode()},"
                              f"i={iterations}")
        return self._server_first.encode()

    def final(self, data: bytes) -> bytes:
        if not self._server_first:
            raise SaslAuthenticationError("SCRAM client-final before client-first")
        message = _text(data)
        without_proof, sep, proof_text = message.rpartition(",p=")
        if not sep:
            raise SaslAuthenticationError("SCRAM client-final has no proof")
        attributes = _attributes(without_proof)
        # Kafka's rule (ScramSaslServer): the nonce ENDS WITH the one we sent. librdkafka
        # up to 2.0 (Debian's kcat) sends the client nonce again in front of it; the
        # server's random part is still there, so a replayed proof still fails.
        if attributes.get("c") != "biws" or not attributes.get("r", "").endswith(
                self._nonce_text) or set(attributes) != {"c", "r"}:
            raise SaslAuthenticationError("SCRAM client-final: wrong nonce or channel binding")
        proof = _b64decode(proof_text, "SCRAM proof")
        credential = self._credential
        auth_message = f"{self._client_first_bare},{self._server_first},{without_proof}".encode()
        if credential is None:
            raise InvariantViolation("SCRAM final without a credential after first")
        signature = _hmac(self._hash, credential.stored_key, auth_message)
        if len(proof) != len(signature):
            raise SaslAuthenticationError("SCRAM proof has the wrong length")
        client_key = bytes(a ^ b for a, b in zip(proof, signature, strict=True))
        if not hmac.compare_digest(hashlib.new(self._hash, client_key).digest(),
                                   credential.stored_key) or not self._known:
            raise SaslAuthenticationError(
                f"authentication failed for user {self._user!r} ({self.mechanism})")
        self.user = self._user
        server_signature = _hmac(self._hash, credential.server_key, auth_message)
        return b"v=" + base64.b64encode(server_signature)


class ScramClient:
    """The client side (tests and the gRPC clients): ``first()``, ``final(server_first)``,
    ``check(server_final)``."""

    def __init__(self, mechanism: str, user: str, password: str, *,
                 nonce: Callable[[], str] = lambda: new_nonce()):
        self.mechanism = mechanism
        self._hash = _hash(mechanism)
        self._password = password
        self._bare = f"n={escape_name(user)},r={nonce()}"
        self._server_signature = b""

    def first(self) -> bytes:
        return f"n,,{self._bare}".encode()

    def final(self, server_first: bytes) -> bytes:
        text = _text(server_first)
        attributes = _attributes(text)
        salt = _b64decode(attributes.get("s", ""), "salt")
        try:
            iterations = int(attributes.get("i", ""))
        except ValueError:
            raise SaslAuthenticationError("SCRAM server-first: bad iteration count") from None
        without_proof = f"c=biws,r={attributes.get('r', '')}"
        salted = salted_password(self.mechanism, self._password, salt, iterations)
        client_key = _hmac(self._hash, salted, b"Client Key")
        stored_key = hashlib.new(self._hash, client_key).digest()
        auth_message = f"{self._bare},{text},{without_proof}".encode()
        signature = _hmac(self._hash, stored_key, auth_message)
        proof = bytes(a ^ b for a, b in zip(client_key, signature, strict=True))
        self._server_signature = _hmac(self._hash, _hmac(self._hash, salted, b"Server Key"),
                                       auth_message)
        return f"{without_proof},p={base64.b64encode(proof).decode()}".encode()

    def check(self, server_final: bytes) -> None:
        if _text(server_final) != "v=" + base64.b64encode(self._server_signature).decode():
            raise SaslAuthenticationError("SCRAM: the server's signature is wrong")


def parse_plain(data: bytes) -> tuple[str, str]:
    """(user, password) of a SASL/PLAIN message ``[authzid] NUL authcid NUL passwd``."""
    parts = data.split(b"\0")
    if len(parts) != 3:
        raise SaslAuthenticationError("SASL/PLAIN message needs exactly two NUL separators")
    authzid, user, password = (_text(p) for p in parts)
    if not user or not password or len(user.encode()) > USER_NAME_BYTES_MAX \
            or len(password.encode()) > PASSWORD_BYTES_MAX:
        raise SaslAuthenticationError("SASL/PLAIN: empty or long user name or password")
    if authzid and authzid != user:
        raise SaslAuthenticationError("SASL/PLAIN: authorization id differs from the user")
    return user, password


# gRPC clients' credentials (broker/security/grpc_auth.py): call metadata carrying the PLAIN
# message, checked against the user's SCRAM credential.
AUTHORIZATION_KEY = "authorization"
# In a refusal's message: the session token is gone (expired, dropped, unknown here), not
# the credentials wrong; a client authenticates again and retries (``client.metadata``).
REAUTHENTICATE_HINT = "authenticate again"
PLAIN_SCHEME = "PLAIN "


def plain_metadata(user: str, password: str) -> tuple[str, str]:
    """The call metadata entry a gRPC client sends (``client.security``)."""
    token = base64.b64encode(b"\0" + user.encode() + b"\0" + password.encode()).decode()
    return AUTHORIZATION_KEY, PLAIN_SCHEME + token
