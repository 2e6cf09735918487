"""The Prometheus /metrics endpoint of a broker or the controller, authenticated in secure
mode (issue 29 item 9).

Open (plain HTTP, no check) only when the process runs with neither TLS nor SASL nor an
authorizer. Otherwise a scrape must show who it is, one of:

- a **client certificate of the cluster's CA** (HTTPS, the TLS handshake asks for one and
  verifies it; Prometheus ``tls_config.cert_file``/``key_file``): principal ``User:<CN>``;
- **HTTP Basic** credentials of a user the cluster knows (the SCRAM credentials of
  ``tide users``, checked as SASL/PLAIN checks them; Prometheus ``basic_auth``).

Anything else is answered ``401`` with ``WWW-Authenticate: Basic`` and no metrics. A
certificate of another CA fails the TLS handshake itself. There is no per-principal
authorization: any authenticated principal may read the (read-only) counters, as JMX in
Kafka is open to whoever may connect to it.

The server is prometheus_client's threaded WSGI server with its own request handler (to
see the verified peer certificate) and TLS context (client certificates *requested*, so
Basic credentials over HTTPS work too); password checks (PBKDF2, cached per credential
by ``PasswordChecker``) run on the request's thread, never on the event loop.
"""

from __future__ import annotations

import base64
import binascii
import socket
import ssl
import threading
from collections.abc import Callable, Iterable
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler

from prometheus_client import CollectorRegistry, make_wsgi_app
from prometheus_client.exposition import ThreadingWSGIServer

from tidewater.broker.security.metrics_listen import listen_metrics
from tidewater.proto.tls import TlsFiles

PEER_CN_KEY = "tidewater.peer_cn"
REALM = "tidewater metrics"
PasswordCheck = Callable[[str, str], bool]
StartResponse = Callable[..., Any]
REQUEST_TIMEOUT_S = 10


class _Server(ThreadingWSGIServer):
    """On a socket already listening (``metrics_listen``). A failed TLS handshake or a
    dropped connection is the peer's business: not logged."""

    def __init__(self, listening: socket.socket, handler_class: type[WSGIRequestHandler]):
        self.address_family = listening.family
        super().__init__(listening.getsockname()[:2], handler_class, bind_and_activate=False)
        self.socket.close()  # the one TCPServer made, never bound
        self.socket = listening
        # What HTTPServer's and WSGIServer's server_bind do after the bind itself.
        host, port = listening.getsockname()[:2]
        self.server_address = (host, port)
        self.server_name = socket.getfqdn(host)
        self.server_port = port
        self.setup_environ()

    def handle_error(self, request: Any, client_address: Any) -> None:
        return None


class _Handler(WSGIRequestHandler):
    """Passes the verified client certificate's CN to the application; logs nothing."""

    timeout = REQUEST_TIMEOUT_S  # a scraper that connects and sends nothing holds a thread this long

    def get_environ(self) -> dict[str, Any]:
        environ = super().get_environ()
        environ[PEER_CN_KEY] = _peer_cn(self.connection)
        return environ

    def log_message(self, format: str, *args: Any) -> None:
        return None


def _peer_cn(connection: object) -> str | None:
    if not isinstance(connection, ssl.SSLSocket):
        return None
    cert = connection.getpeercert()
    if not cert:
        return None  # none shown (with CERT_OPTIONAL an unverifiable one fails the handshake)
    for rdn in cert.get("subject", ()):
        for attribute in rdn:
            if attribute[0] == "commonName":
                return str(attribute[1])
    return None


def basic_credentials(header: str | None) -> tuple[str, str] | None:
    """(user, password) of an ``Authorization: Basic ...`` header, None if absent or bad."""
    if not header:
        return None
    scheme, _, encoded = header.strip().partition(" ")
    if scheme.lower() != "basic":
        return None
    try:
        decoded = base64.b64decode(encoded.strip(), validate=True).decode("utf-8")
    except (binascii.Error, UnicodeDecodeError):
        return None
    user, sep, password = decoded.partition(":")
    if not sep or not user:
        return None
    return user, password


def guarded_app(inner: Callable[[dict[str, Any], StartResponse], Iterable[bytes]],
                check_password: PasswordCheck | None
                ) -> Callable[[dict[str, Any], StartResponse], Iterable[bytes]]:
    """``inner`` answered only for a verified client certificate or good Basic credentials."""

    def app(environ: dict[str, Any], start_response: StartResponse) -> Iterable[bytes]:
        if environ.get(PEER_CN_KEY):
            return inner(environ, start_response)
        credentials = basic_credentials(environ.get("HTTP_AUTHORIZATION"))
        if credentials is not None and check_password is not None \
                and check_password(*credentials):
            return inner(environ, start_response)
        body = b"authentication required: a client certificate of the cluster's CA or " \
               b"HTTP Basic credentials of a cluster user\n"
        start_response("401 Unauthorized", [
            ("Content-Type", "text/plain; charset=utf-8"), ("Content-Length", str(len(body))),
            ("WWW-Authenticate", f'Basic realm="{REALM}", charset="UTF-8"')])
        return [body]

    return app


def server_context(tls: TlsFiles) -> ssl.SSLContext:
    """HTTPS with the process's certificate; a client certificate of the CA is asked for
    (verified when shown, not required: Basic credentials are the other way in)."""
    assert tls.cert is not None and tls.key is not None  # a server's TlsFiles have them
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.load_cert_chain(str(tls.cert), str(tls.key))
    context.load_verify_locations(cafile=str(tls.ca))
    context.verify_mode = ssl.CERT_OPTIONAL
    return context


def serve_metrics(registry: CollectorRegistry, host: str, port: int, *,
                  tls: TlsFiles | None, secured: bool,
                  check_password: PasswordCheck | None
                  ) -> tuple[ThreadingWSGIServer, threading.Thread]:
    """Serve ``registry`` at ``host:port`` on a daemon thread: HTTPS with ``tls``; with
    ``tls`` or ``secured`` (SASL or an authorizer) only to an authenticated scraper."""
    return serve_metrics_on(registry, listen_metrics(host, port), tls=tls, secured=secured,
                            check_password=check_password)


def serve_metrics_on(registry: CollectorRegistry, listening: socket.socket, *,
                     tls: TlsFiles | None, secured: bool,
                     check_password: PasswordCheck | None
                     ) -> tuple[ThreadingWSGIServer, threading.Thread]:
    """``serve_metrics`` on a socket ``listen_metrics`` made (it is the server's now)."""
    app = make_wsgi_app(registry)
    if tls is not None or secured:
        app = guarded_app(app, check_password)
    server = _Server(listening, _Handler)
    server.set_app(app)
    if tls is not None:
        # The handshake on the handler's thread (first read), not in accept(): a client
        # that connects and stays silent must not hold up the others.
        server.socket = server_context(tls).wrap_socket(server.socket, server_side=True,
                                                        do_handshake_on_connect=False)
    thread = threading.Thread(target=server.serve_forever, name="metrics-http", daemon=True)
    thread.start()
    return server, thread
