"""Issue 29: what a certificate may serve as, whose name a channel checks, and where the
controller's /metrics listens.

Real ``python -m tidewater.controller`` processes with certificates from ``tools/certs.py``:

- a controller serving with a *client* certificate (clientAuth only, signed by the
  cluster's CA) is refused by the client side: a member's gRPC channel and an OpenSSL
  client both fail the handshake, where the same controller with its own certificate
  answers;
- a server certificate that does not name the address dialled is refused by a gRPC
  channel (the peer's name is checked against the certificate's SANs);
- a broker's channel to the controller takes only a controller certificate: a
  broker's certificate of the same CA serving as the controller is refused;
- the controller's /metrics listens on 127.0.0.1 unless ``metrics.bind.address`` says
  otherwise, and is HTTPS with the controller's certificate when it has TLS.
"""

from __future__ import annotations

import asyncio
import datetime
import os
import select
import signal
import socket
import ssl
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import grpc
import pytest

from tidewater.proto import tidewater_pb2 as pb
from tidewater.proto import tidewater_pb2_grpc as pb_grpc
from tidewater.tools import certs
from tidewater.tools.scrape import ScrapeCredentials, fetch_metrics

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

ROOT = Path(__file__).resolve().parents[2]
RPC_TIMEOUT_S = 5


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Controller:
    """One ``python -m tidewater.controller`` process; ``stop()`` ends it by its pid."""

    def __init__(self, tmp: Path, *args: str, listen_host: str = "127.0.0.1",
                 metrics_port: int = 0):
        self.port = free_port()
        self.metrics_port = metrics_port
        self.stderr_path = tmp / f"controller-{self.port}.stderr"
        cmd = [sys.executable, "-m", "tidewater.controller",
               "--listen", f"{listen_host}:{self.port}", "--data-dir", str(tmp / f"c{self.port}"),
               "--metrics-port", str(metrics_port), *args]
        with open(self.stderr_path, "wb") as stderr:
            self.proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=stderr,
                                         env={k: v for k, v in os.environ.items()
                                              if not k.startswith("TIDE_TLS_")})
        ready, _, _ = select.select([self.proc.stdout], [], [], 20)
        line = self.proc.stdout.readline().decode() if ready else ""
        if "listening" not in line:
            self.stop()
            raise RuntimeError(f"controller did not start: {line!r}\n"
                               f"{self.stderr_path.read_text(errors='replace')}")

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.kill(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=10)
        if self.proc.stdout is not None:
            self.proc.stdout.close()


@pytest.fixture(scope="module")
def tls_dir(tmp_path_factory) -> Path:
    """The cluster's CA, controller, broker-1 and client certificates, and two that serve
    wrongly: ``elsewhere`` (a controller certificate naming only elsewhere.invalid)."""
    directory = tmp_path_factory.mktemp("certs")
    now = datetime.datetime.now(datetime.UTC)
    certs.make_cluster_dir(directory, [1], now=now)
    certs.issue_to_dir(directory, name="elsewhere", role="controller",
                       hosts=("elsewhere.invalid",), now=now)
    return directory


def tls_flags(directory: Path, name: str) -> list[str]:
    return ["--tls-ca", str(directory / "ca.pem"), "--tls-cert", str(directory / f"{name}.pem"),
            "--tls-key", str(directory / f"{name}.key")]


def member_channel(directory: Path, address: str) -> grpc.Channel:
    """What a broker opens to the controller: trusts the CA, presents broker-1's certificate."""
    return grpc.secure_channel(address, grpc.ssl_channel_credentials(
        root_certificates=(directory / "ca.pem").read_bytes(),
        private_key=(directory / "broker-1.key").read_bytes(),
        certificate_chain=(directory / "broker-1.pem").read_bytes()))


def describe(directory: Path, address: str) -> pb.DescribeClusterResponse:
    with member_channel(directory, address) as channel:
        return pb_grpc.ControllerStub(channel).DescribeCluster(pb.DescribeClusterRequest(),
                                                               timeout=RPC_TIMEOUT_S)


def openssl_handshake(directory: Path, address: str) -> None:
    host, _, port = address.rpartition(":")
    context = ssl.create_default_context(cafile=str(directory / "ca.pem"))
    context.load_cert_chain(directory / "broker-1.pem", directory / "broker-1.key")
    with socket.create_connection((host, int(port)), timeout=RPC_TIMEOUT_S) as raw:
        with context.wrap_socket(raw, server_hostname=host):
            pass


def test_a_client_certificate_cannot_serve_as_a_cluster_member(tls_dir, tmp_path):
    impostor = Controller(tmp_path, *tls_flags(tls_dir, "client"))
    try:
        with pytest.raises(grpc.RpcError) as refused:
            describe(tls_dir, impostor.address)
        assert refused.value.code() == grpc.StatusCode.UNAVAILABLE, refused.value
        with pytest.raises(ssl.SSLCertVerificationError) as not_a_server:
            openssl_handshake(tls_dir, impostor.address)
        assert "certificate purpose" in str(not_a_server.value)
    finally:
        impostor.stop()
    # The same process with the controller's own certificate is trusted by both.
    genuine = Controller(tmp_path, *tls_flags(tls_dir, "controller"))
    try:
        assert describe(tls_dir, genuine.address).cluster_id
        openssl_handshake(tls_dir, genuine.address)
    finally:
        genuine.stop()


def test_a_channel_checks_the_server_name_against_its_certificate(tls_dir, tmp_path):
    misnamed = Controller(tmp_path, *tls_flags(tls_dir, "elsewhere"))
    try:
        with pytest.raises(grpc.RpcError) as refused:
            describe(tls_dir, misnamed.address)  # dials 127.0.0.1: not in its SANs
        assert refused.value.code() == grpc.StatusCode.UNAVAILABLE, refused.value
        with pytest.raises(ssl.SSLCertVerificationError) as wrong_name:
            openssl_handshake(tls_dir, misnamed.address)
        assert "IP address mismatch" in str(wrong_name.value)
    finally:
        misnamed.stop()


async def broker_link_describe(directory: Path, address: str) -> pb.DescribeClusterResponse:
    """DescribeCluster through a broker's own channel to the controller (broker-1's)."""
    from tidewater.broker.controller_link.channel import ControllerChannel
    from tidewater.proto.tls import TlsFiles, channel_credentials

    files = TlsFiles.from_flags(str(directory / "ca.pem"), str(directory / "broker-1.pem"),
                                str(directory / "broker-1.key"))
    assert files is not None
    host, _, port = address.rpartition(":")
    link = ControllerChannel(broker_id=1, controller_address=(host, int(port)), listeners=[],
                             heartbeat_interval_ms=1000, session_timeout_ms=9000,
                             credentials=channel_credentials(files.load()))
    try:
        return await link.stub.DescribeCluster(pb.DescribeClusterRequest(),
                                               timeout=RPC_TIMEOUT_S)
    finally:
        await link.close()


def test_a_brokers_controller_channel_takes_only_a_controller_certificate(tls_dir, tmp_path):
    """A broker's certificate (the same CA, serving as 127.0.0.1) standing in for the
    controller: a plain channel to 127.0.0.1 takes it, the broker's channel does not."""
    impostor = Controller(tmp_path, *tls_flags(tls_dir, "broker-1"))
    try:
        assert describe(tls_dir, impostor.address).cluster_id  # the name alone passes
        with pytest.raises(grpc.RpcError) as refused:
            asyncio.run(broker_link_describe(tls_dir, impostor.address))
        assert refused.value.code() == grpc.StatusCode.UNAVAILABLE, refused.value
    finally:
        impostor.stop()
    genuine = Controller(tmp_path, *tls_flags(tls_dir, "controller"))
    try:
        assert asyncio.run(broker_link_describe(tls_dir, genuine.address)).cluster_id
    finally:
        genuine.stop()


def listening_addresses(port: int) -> set[str]:
    """The local addresses of the sockets listening on ``port`` (/proc/net/tcp, tcp6)."""
    found = set()
    for table, family in (("tcp", socket.AF_INET), ("tcp6", socket.AF_INET6)):
        path = Path("/proc/net") / table
        if not path.exists():
            continue
        for line in path.read_text().splitlines()[1:]:
            fields = line.split()
            address, _, hex_port = fields[1].partition(":")
            if int(hex_port, 16) == port and fields[3] == "0A":  # TCP_LISTEN
                raw = b"".join(bytes.fromhex(address[i:i + 8])[::-1]
                               for i in range(0, len(address), 8))  # host-order words
                found.add(socket.inet_ntop(family, raw))
    return found


def test_controller_metrics_bind_loopback_unless_told(tmp_path):
    metrics_port = free_port()
    default = Controller(tmp_path, listen_host="0.0.0.0", metrics_port=metrics_port)
    try:
        assert listening_addresses(default.port) & {"0.0.0.0", "::"}  # gRPC: as told
        assert listening_addresses(metrics_port) == {"127.0.0.1"}
        text = fetch_metrics(f"http://127.0.0.1:{metrics_port}/metrics", 10, None)
        assert "tidewater_controller_active_controller 1.0" in text
    finally:
        default.stop()
    metrics_port = free_port()
    everywhere = Controller(tmp_path, "--set", "metrics.bind.address=0.0.0.0",
                            metrics_port=metrics_port)
    try:
        assert listening_addresses(metrics_port) == {"0.0.0.0"}
    finally:
        everywhere.stop()
    bad = subprocess.run([sys.executable, "-m", "tidewater.controller", "--data-dir",
                          str(tmp_path / "bad"), "--set", "metrics.bind.address="],
                         cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "metrics.bind.address is empty" in bad.stderr, bad


def test_controller_metrics_are_https_with_tls(tls_dir, tmp_path):
    metrics_port = free_port()
    controller = Controller(tmp_path, *tls_flags(tls_dir, "controller"),
                            metrics_port=metrics_port)
    try:
        url = f"https://127.0.0.1:{metrics_port}/metrics"
        # A client certificate of the CA is what a scrape shows (test_metrics_auth.py).
        client = ScrapeCredentials(str(tls_dir / "client.pem"), str(tls_dir / "client.key"))
        assert "tidewater_controller_active_controller 1.0" in fetch_metrics(
            url, 10, str(tls_dir / "ca.pem"), client)
        with pytest.raises((OSError, ConnectionError)):  # plain HTTP: no metrics
            body = urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics",
                                          timeout=10).read()
            assert b"tidewater_controller_" not in body  # never reached
        with pytest.raises((urllib.error.URLError, ssl.SSLError)):  # not trusting our CA
            urllib.request.urlopen(url, timeout=10, context=ssl.create_default_context())
    finally:
        controller.stop()
