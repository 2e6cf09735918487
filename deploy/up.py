"""Second half of `make up`: wait for the compose cluster, then create the demo topic.

Run with the host venv after `docker-compose up -d`:
    .venv/bin/python deploy/up.py [--compose-project tidewater] [--topic demo]

Waits until every container's health check passes and every broker is
registered and unfenced, creates the topic (an existing one is fine) and waits
until each of its partitions has a leader and a full ISR. With SASL and ACLs
(deploy/compose-sasl.yml) it connects as the admin super user and grants the web
console's user DESCRIBE on the cluster, every topic and every group, nothing more. Prints the addresses
to use from the host (gRPC, Kafka, metrics) and the Kafka bootstrap inside the
compose network. Exit 1 with a one-line reason on failure.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the checkout, when not installed

from tidewater.client.admin import AdminClient, NewTopic
from tidewater.proto import acls as a
from tidewater.proto import tidewater_pb2 as pb
from tidewater.proto.errors import TidewaterError
from tidewater.tools.chaos.targets import ChaosTargetError, ComposeCluster

READY_TIMEOUT_S = 180
CONSOLE_PRINCIPAL = "User:console"  # deploy/sasl_users.py's console user
# What the read-only web console needs: DESCRIBE on the cluster, every topic, every group.
CONSOLE_ACLS = [a.Acl(resource, name, a.LITERAL, CONSOLE_PRINCIPAL, a.ANY_HOST, a.DESCRIBE,
                      a.ALLOW)
                for resource, name in ((a.CLUSTER, a.CLUSTER_NAME), (a.TOPIC, a.WILDCARD),
                                       (a.GROUP, a.WILDCARD))]


def wait_for_brokers(admin: AdminClient, broker_ids: list[int], deadline: float) -> None:
    last = "no answer"
    while time.monotonic() < deadline:
        try:
            cluster = admin.describe_cluster()
            live = {b.broker_id for b in cluster.brokers if not b.fenced}
            if set(broker_ids) <= live:
                return
            last = f"live brokers {sorted(live)}"
        except TidewaterError as e:
            last = str(e)
        time.sleep(0.5)
    raise ChaosTargetError(f"brokers {broker_ids} not all registered: {last}")


def ensure_topic(admin: AdminClient, topic: str, partitions: int, replication_factor: int,
                 min_insync_replicas: int, deadline: float) -> None:
    errors = admin.create_topics([NewTopic(topic, partitions, replication_factor,
                                           {"min.insync.replicas": str(min_insync_replicas)})])
    error = errors.get(topic)
    if error is not None and getattr(error, "error_code", None) != pb.TOPIC_ALREADY_EXISTS:
        raise ChaosTargetError(f"create topic {topic}: {error}")
    last = "not described yet"
    while time.monotonic() < deadline:
        try:
            (info,) = admin.describe_topics([topic], with_replica_state=False)
            waiting = [p.partition for p in info.partitions
                       if p.leader < 0 or len(p.isr) < len(p.replicas)]
            if not waiting:
                return
            last = f"partitions without leader or full ISR: {waiting}"
        except TidewaterError as e:
            last = str(e)
        time.sleep(0.5)
    raise ChaosTargetError(f"topic {topic}: {last}")


def console_url(cluster: ComposeCluster) -> str | None:
    """The web console's address from the host (the `console` service), once it answers."""
    try:
        container = cluster.container("console")
    except ChaosTargetError:
        return None  # a compose file without the console
    try:
        cluster.wait_healthy(["console"], timeout_s=60)
        published = subprocess.run(["docker", "port", container, "9800/tcp"], capture_output=True,
                                   text=True, timeout=30).stdout.split()
    except (ChaosTargetError, OSError, subprocess.TimeoutExpired):
        return None
    if not published:
        return None
    host, _sep, port = published[0].rpartition(":")
    if host in ("0.0.0.0", "::", "[::]"):
        host = "127.0.0.1"
    return f"http://{host}:{port}/"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--compose-project", default="tidewater")
    parser.add_argument("--compose-file", type=Path, default=None, help="(informational)")
    parser.add_argument("--topic", default="demo")
    parser.add_argument("--partitions", type=int, default=3)
    parser.add_argument("--replication-factor", type=int, default=3)
    parser.add_argument("--min-insync-replicas", type=int, default=2)
    parser.add_argument("--timeout-s", type=float, default=READY_TIMEOUT_S)
    args = parser.parse_args(argv)
    deadline = time.monotonic() + args.timeout_s
    try:
        cluster = ComposeCluster(args.compose_project)
        cluster.wait_healthy(timeout_s=args.timeout_s)
        bootstrap = cluster.bootstrap()
        security = cluster.client_security()  # TLS when deploy/compose-tls.yml is in use
        with AdminClient(bootstrap, request_timeout_ms=5000, **security) as admin:
            wait_for_brokers(admin, cluster.broker_ids(), deadline)
            if args.topic:
                ensure_topic(admin, args.topic, args.partitions, args.replication_factor,
                             args.min_insync_replicas, deadline)
            if security.get("security_protocol") == "SASL_SSL":
                admin.create_acls(CONSOLE_ACLS)  # the same bindings again: no change
        metrics = ", ".join(f"{t.source} {t.url}" for t in cluster.metrics_targets())
        kafka_host, kafka_network = cluster.kafka_bootstrap(), cluster.kafka_network_bootstrap()
        console = console_url(cluster)
    except (ChaosTargetError, TidewaterError) as e:
        print(f"up: {e}", file=sys.stderr)
        return 1
    print(f"cluster {args.compose_project} is up; bootstrap {bootstrap.split(',')[0]}")
    if args.topic:
        print(f"topic {args.topic}: {args.partitions} partitions, replication factor "
              f"{args.replication_factor}, min.insync.replicas={args.min_insync_replicas}")
    print(f"kafka bootstrap from the host: {kafka_host}")
    print(f"kafka bootstrap inside network {cluster.network}: {kafka_network}")
    print(f"metrics: {metrics}")
    print(f"web console: {console}" if console else
          "web console: not serving (see `docker-compose logs console`)")
    if security.get("security_protocol") == "SASL_SSL":
        tls_dir = Path(security.get("ssl_cafile") or "").parent
        print(f"TLS on every port, SASL_SSL Kafka listeners and ACLs: export "
              f"TIDE_COMMAND_CONFIG={tls_dir / 'sasl' / 'admin.properties'}  (the super user; "
              f"kcat -X security.protocol=SASL_SSL -X sasl.mechanism="
              f"{security.get('sasl_mechanism')} -X sasl.username=admin ...)")
    elif security:
        tls_dir = Path(security.get("ssl_cafile") or "").parent
        print(f"TLS on every port: export TIDE_COMMAND_CONFIG={tls_dir / 'client.properties'}  "
              f"(kcat -X security.protocol=SSL -X ssl.ca.location={security.get('ssl_cafile')} "
              "...)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
