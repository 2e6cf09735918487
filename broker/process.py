"""The broker process's lifecycle: start-up order, background tasks, clean shutdown.

Start-up: open and recover the logs (LogManager.load), read the HW checkpoint,
start the gRPC servers (only now: logs are loaded), then register with the
controller (retrying until it is reachable) and heartbeat. The controller
answers a registration by pushing LeaderAndIsr and UpdateMetadata.

Shutdown (SIGTERM): controlled shutdown first (heartbeat ``want_shutdown``
until the controller has moved leadership away, bounded by
``controlled.shutdown.timeout.ms``), then the servers stop with a grace
period, tasks stop, and LogManager.shutdown writes the HW checkpoint and the
clean-shutdown marker. A SIGKILL at any point loses nothing committed: an
acks=all answer is only sent once every ISR replica has the records.

TLS (``--tls-*``): read once here; INTERNAL requires client certificates of
the cluster's CA (mutual TLS: the controller and the followers), EXTERNAL and
the Kafka listeners take any TLS client; the broker's own channels (to the
controller, to leaders) present its certificate.

Every background task runs under ``supervisor``: one that dies (or a broken
invariant at a request boundary) sets ``fatal``; ``broker/__main__`` then
shuts down and exits with code 70.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import logging
import ssl
import time
from typing import TYPE_CHECKING

import grpc

from tidewater.broker.clock import mono_ms
from tidewater.broker.config import BrokerConfig
from tidewater.broker.controller_link.channel import ControllerChannel
from tidewater.broker.coordinators import Built, Coordinators
from tidewater.broker.kafka.apis import Services, topic_config_entries
from tidewater.broker.kafka.auto_create import AutoTopicCreator
from tidewater.broker.kafka.broker_configs import (
    BrokerConfigEntry,
    broker_config_entries,
    cluster_default_entries,
    topic_default_sources,
)
from tidewater.broker.kafka.connection_quotas import ConnectionQuotas
from tidewater.broker.kafka.fetch_sessions import FetchSessionCache
from tidewater.broker.kafka.server import KafkaListener
from tidewater.broker.metrics import BrokerMetrics
from tidewater.broker.replicas.metadata_cache import MetadataCache
from tidewater.broker.replicas.replica_manager import ReplicaManager
from tidewater.broker.security.grpc_preauth import CONTROLLER_CALLS, PreAuthentication
from tidewater.broker.security.inter_broker import (
    ChannelOpener,
    InterBrokerCredentials,
    inter_broker_mechanism,
    plain_channel,
)
from tidewater.broker.security.settings import BrokerSecurity
from tidewater.broker.security.stream_expiry import SessionStreamLimit
from tidewater.broker.servicers.admin_forwarding import ControllerForwarder
from tidewater.broker.servicers.grpc_limits import GrpcLimits
from tidewater.broker.servicers.grpc_server import (
    BrokerControlServicer,
    BrokerServicer,
    build_server,
)
from tidewater.broker.servicers.guarded_admin_forwarding import GuardedControllerForwarder
from tidewater.broker.servicers.sasl import SaslServicer
from tidewater.broker.serving.txn_markers import TxnMarkerEntry
from tidewater.broker.storage.log_config import LogConfig
from tidewater.broker.storage.log_manager import LogManager
from tidewater.broker.storage.topics import CONSUMER_OFFSETS_TOPIC
from tidewater.broker.txn.verification import TopicPartition
from tidewater.proto import tidewater_pb2 as pb
from tidewater.proto.errors import DuplicateBrokerRegistrationError, InvariantViolation, code_name
from tidewater.proto.supervisor import TaskSupervisor
from tidewater.proto.tls import channel_credentials, server_credentials, server_ssl_context

if TYPE_CHECKING:
    from tidewater.broker.txn.marker_sender import LeaderMarkerSender
    from tidewater.broker.txn.verifier import TxnPartitionVerifier

log = logging.getLogger("tidewater.broker")


SERVER_GRACE_S = 2.0
# How often the coordinators' build looks whether this broker serves yet.
SERVING_POLL_S = 0.01
# The longest /metrics waits for the broker to serve before it answers anyway.
METRICS_SERVE_WAIT_S_MAX = 2.0
# How long the broker serves before the work that waits for it starts (``settled``).
SETTLE_AFTER_SERVING_S = 0.5


class BrokerProcess:
    def __init__(self, config: BrokerConfig):
        self.config = config
        self.metrics = BrokerMetrics(config.broker_id)
        self.metadata_cache = MetadataCache()
        self.security = BrokerSecurity(config.security, self.metadata_cache)
        # One count for every Kafka listener (max.connections is the broker's).
        self.connection_quotas = ConnectionQuotas(config.connection_limits, mono_ms())
        self.log_manager: LogManager | None = None
        self.replica_manager: ReplicaManager | None = None
        # The group and transaction coordinators (start() makes the accessor): built at
        # their first use or once this broker serves (coordinators.py).
        self.coordinators: Coordinators | None = None
        self.marker_sender: LeaderMarkerSender | None = None
        self.txn_verifier: TxnPartitionVerifier | None = None
        self.controller_channel: ControllerChannel | None = None
        self.servers: list[grpc.aio.Server] = []
        self.kafka_listeners: list[KafkaListener] = []
        self.auto_create: AutoTopicCreator | None = None
        # One fetch session cache for every Kafka listener, as Kafka's FetchManager.
        self.fetch_sessions = FetchSessionCache(
            config.max_incremental_fetch_session_cache_slots,
            config.min_incremental_fetch_session_eviction_ms)
        self.metrics.register_fetch_sessions(self.fetch_sessions.metrics_view)
        self.metrics.register_client_quotas(self.metadata_cache.client_quotas)
        self.bound_ports: dict[str, int] = {}
        self._controller_task: asyncio.Task[None] | None = None
        self._coordinators_task: asyncio.Task[None] | None = None
        self._metrics_task: asyncio.Task[None] | None = None
        # A background task that dies, or a broken invariant, stops the broker: ``fatal``
        # is set and the process exits non-zero after a shutdown (broker/__main__.py).
        self.fatal = asyncio.Event()
        # Set once this broker serves (unfenced, named in the controller's metadata): what
        # may wait until then waits on it (the coordinators here, __main__'s tune_gc).
        self.serving = asyncio.Event()
        # Set SETTLE_AFTER_SERVING_S after ``serving``: the work that waits for the broker
        # to serve starts then (the coordinators' build, /metrics, __main__'s gc pass).
        self.settled = asyncio.Event()
        self.supervisor = TaskSupervisor(on_fatal=lambda error: self.fatal.set())

    def _listeners(self) -> list[pb.Listener]:
        c = self.config
        assert c.advertise is not None  # BrokerConfig.__post_init__: listen when not given
        listeners = [pb.Listener(name="INTERNAL", host=c.advertise[0], port=c.advertise[1])]
        if c.external_advertise is not None:
            listeners.append(pb.Listener(name="EXTERNAL", host=c.external_advertise[0],
                                         port=c.external_advertise[1]))
        return listeners

    async def start(self) -> None:
        c = self.config
        c.data_dir.mkdir(parents=True, exist_ok=True)
        started = time.monotonic()
        loop = asyncio.get_running_loop()
        self.supervisor.watch_callbacks(loop)  # a broken invariant in a timer stops it too

        def storage_thread_failed(error: BaseException) -> None:
            loop.call_soon_threadsafe(self.supervisor.fail, error)

        manager = LogManager(
            c.data_dir, LogConfig.from_configs(c.log_config_overrides()),
            # The deleter's own thread reports its death, the flush-log thread a broken
            # invariant: the broker stops (supervised).
            on_deleter_failure=storage_thread_failed,
            on_flush_failure=storage_thread_failed,
            producer_id_expiration_ms=c.producer_id_expiration_ms,
            recovery_threads=c.num_recovery_threads_per_data_dir)
        # A failed load (a corrupt partition.metadata) leaves the data dir as it found it:
        # no shutdown writes checkpoints or the clean-shutdown marker over half-loaded logs.
        manager.load(int(time.time() * 1000))
        self.log_manager = manager
        log.info("loaded %d logs in %.2fs (%s)",
                 len(self.log_manager.logs()), time.monotonic() - started,
                 "new data dir" if manager.is_new
                 else f"clean shutdown before: {manager.had_clean_shutdown}")
        tls = c.tls.load() if c.tls is not None else None  # TlsConfigError: cannot start
        # What this broker presents on its own channels (to the controller, to leaders).
        member_credentials = channel_credentials(tls) if tls is not None else None
        # And the SASL user it fetches as (CredentialsFileError: cannot start).
        # SCRAM where the brokers enable it (``inter_broker_mechanism``): no password on
        # the wire, only session tokens; PLAIN in each call's metadata otherwise.
        mechanism = inter_broker_mechanism(c.security.sasl_mechanisms,
                                           c.security.inter_broker_mechanism)
        inter_broker = (
            dataclasses.replace(InterBrokerCredentials.read(c.inter_broker_credentials_file),
                                mechanism=mechanism)
            if c.inter_broker_credentials_file else None)
        if c.controller_sasl_user is not None or inter_broker is not None:
            log.info("broker %d authenticates with %s (sasl.mechanism.inter.broker.protocol) "
                     "to the controller as %s, to other brokers as %s", c.broker_id, mechanism,
                     c.controller_sasl_user[0] if c.controller_sasl_user else "-",
                     inter_broker.username if inter_broker else "-")
        inter_broker_metadata = inter_broker.call_metadata() if inter_broker else ()
        open_inter_broker = inter_broker.open_channel if inter_broker else plain_channel
        self.controller_channel = ControllerChannel(
            broker_id=c.broker_id, controller_address=c.controller, listeners=self._listeners(),
            controller_bootstrap=c.controller_bootstrap,
            heartbeat_interval_ms=c.broker_heartbeat_interval_ms,
            session_timeout_ms=c.broker_session_timeout_ms,
            max_message_bytes=c.socket_request_max_bytes,
            credentials=member_credentials, rack=c.broker_rack, sasl_user=c.controller_sasl_user,
            sasl_mechanism=mechanism)
        channel = self.controller_channel
        self.replica_manager = ReplicaManager(
            config=c, log_manager=self.log_manager, metadata_cache=self.metadata_cache,
            metrics=self.metrics, alter_partition=channel.alter_partition,
            broker_epoch=lambda: channel.broker_epoch, supervisor=self.supervisor,
            report_corrupt_replica=channel.report_corrupt_replica,
            control_token=lambda: channel.control_token,
            channel_credentials=member_credentials,
            fetch_call_metadata=inter_broker_metadata,
            fetch_open_channel=open_inter_broker,
            allocate_producer_ids=channel.allocate_producer_ids)
        self.replica_manager.load()
        # A quorum's new active controller resyncs us: our heartbeats follow it.
        self.replica_manager.control.on_new_controller = channel.follow_active
        forwarder = ControllerForwarder(channel.stub)
        self.coordinators = coordinators = Coordinators(functools.partial(
            self._build_coordinators, forwarder, member_credentials, inter_broker_metadata,
            open_inter_broker))

        # A marker committed on an __consumer_offsets partition led here releases (COMMIT)
        # or drops (ABORT) the transaction's TxnOffsetCommit offsets. Not built yet: no
        # group is loaded, and the load replays the marker from the log.
        def on_marker_committed(marker: TxnMarkerEntry, topic: str, partition: int) -> None:
            built = coordinators.built
            if topic == CONSUMER_OFFSETS_TOPIC and built is not None:
                built[0].complete_transaction(partition, marker.producer_id, marker.committed)
        self.replica_manager.txn_markers.on_committed = on_marker_committed
        self.replica_manager.producer.verify = self._verify_txn_partitions
        # Clients' admin calls on gRPC are checked first when security is on.
        guarded = (GuardedControllerForwarder(forwarder, self.security)
                   if self.security.secured else forwarder)
        listeners = [("INTERNAL", c.listen)]
        if tls is None and "PLAIN" in c.security.sasl_mechanisms:
            log.warning("SASL/PLAIN is enabled on gRPC listeners without TLS: clients using "
                        "it send their password in clear on every call (enable TLS, or "
                        "SCRAM only)")
        if c.external_listen is not None:
            listeners.append(("EXTERNAL", c.external_listen))
        for name, (host, port) in listeners:
            servicer = BrokerServicer(self.replica_manager, self.metadata_cache, self.metrics, name,
                                      security=self.security,
                                      coordinators=coordinators,
                                      topic_configs=self._described_topic_configs)
            # The control service only where cluster members connect, never for clients.
            internal = name == "INTERNAL"
            control = (BrokerControlServicer(self.replica_manager, self.metrics,
                                             authenticating=tls is not None,
                                             security=self.security,
                                             coordinators=coordinators)
                       if internal else None)
            # Mutual TLS where cluster members connect; clients need no certificate.
            credentials = (server_credentials(tls, require_client_auth=internal)
                           if tls is not None else None)
            server, bound = build_server(host=host, port=port, servicer=servicer,
                                         controller_servicer=guarded,
                                         max_message_bytes=c.socket_request_max_bytes,
                                         control_servicer=control, credentials=credentials,
                                         sasl_servicer=SaslServicer(self.security),
                                         limits=GrpcLimits(
                                             # Members' calls: the controller's and
                                             # every follower's, on few connections.
                                             max_concurrent_streams=1_000 if internal
                                             else 100,
                                             max_connection_idle_ms=c.connections_max_idle_ms,
                                             max_connections=c.max_connections),
                                         interceptors=[
                                             *self._preauthentication(internal),
                                             SessionStreamLimit(self.security.grpc_sessions)])
            await server.start()
            self.servers.append(server)
            self.bound_ports[name] = bound
            log.info("broker %d serving %s on %s:%d%s", c.broker_id, name, host, bound,
                     (" (TLS, client certificates required)" if internal else " (TLS)")
                     if tls is not None else "")
        kafka_ssl = server_ssl_context(c.tls) if c.tls is not None else None
        for name, listen, advertise in c.kafka_listeners():
            await self._start_kafka_listener(forwarder, name, listen, advertise, kafka_ssl)
        if c.metrics_port:
            # The port is taken now; it is answered once the broker serves (_serve_metrics).
            self.metrics.listen(c.metrics_bind_address, c.metrics_port)
            self._metrics_task = self.supervisor.spawn(self._serve_metrics(), "metrics-http")
        self.replica_manager.start()
        self._controller_task = self.supervisor.spawn(self._controller_session(channel),
                                                      "controller-session")

    def _build_coordinators(self, forwarder: ControllerForwarder,
                            member_credentials: grpc.ChannelCredentials | None,
                            inter_broker_metadata: tuple[tuple[str, str], ...],
                            open_inter_broker: ChannelOpener) -> Built:
        """The group and transaction coordinators, started, with the marker sender and the
        KIP-890 verifier over them: ``self.coordinators`` calls this once. Their modules
        are imported here, not before the broker serves (coordinators.py)."""
        from tidewater.broker.group.coordinator import GroupCoordinator
        from tidewater.broker.txn.coordinator import TransactionCoordinator
        from tidewater.broker.txn.marker_sender import LeaderMarkerSender
        from tidewater.broker.txn.verifier import TxnPartitionVerifier

        c = self.config
        if self.replica_manager is None:
            raise InvariantViolation("the coordinators before the replica manager")
        groups = GroupCoordinator(
            replica_manager=self.replica_manager, metadata_cache=self.metadata_cache,
            controller=forwarder, config=c, supervisor=self.supervisor)
        # Markers to partition leaders: in process when led here, else over the leader's
        # INTERNAL gRPC with what the follower fetchers present (certificate, SASL).
        self.marker_sender = LeaderMarkerSender(
            broker_id=c.broker_id, local_writer=self.replica_manager.txn_markers,
            endpoint=self.metadata_cache.endpoint,
            max_message_bytes=c.socket_request_max_bytes,
            channel_credentials=member_credentials, call_metadata=inter_broker_metadata,
            open_channel=open_inter_broker)
        txns = TransactionCoordinator(
            replica_manager=self.replica_manager, metadata_cache=self.metadata_cache,
            controller=forwarder, config=c, supervisor=self.supervisor,
            marker_sender=self.marker_sender,
            next_producer_id=self.replica_manager.producer_ids.next_producer_id)
        # KIP-890 part 1: a transactional batch opening a transaction here is verified
        # with its coordinator first, in process or over the marker sender's channels.
        self.txn_verifier = TxnPartitionVerifier(
            broker_id=c.broker_id, coordinator=txns,
            metadata_cache=self.metadata_cache, remote_stub=self.marker_sender.remote_stub,
            call_metadata=inter_broker_metadata)
        groups.start()
        txns.start()
        return groups, txns

    async def _verify_txn_partitions(self, transactional_id: str, producer_id: int,
                                     producer_epoch: int, partitions: list[TopicPartition]
                                     ) -> dict[TopicPartition, pb.ErrorCode]:
        """The produce path's KIP-890 check (``TxnPartitionVerifier.verify``), building
        the coordinators first if nothing has yet."""
        if self.coordinators is None:
            raise InvariantViolation("a transactional produce before start-up")
        self.coordinators.ensure_built()
        if self.txn_verifier is None:
            raise InvariantViolation("coordinators built without the verifier")
        return await self.txn_verifier.verify(transactional_id, producer_id, producer_epoch,
                                              partitions)

    def _preauthentication(self, internal: bool) -> list[PreAuthentication]:
        """With SASL, a call is refused before its request is read unless its metadata
        authenticates it (``grpc_preauth``); not where the TLS handshake required a
        certificate (INTERNAL with TLS): members authenticate by certificate there."""
        if not self.security.sasl_enabled or (internal and self.config.tls is not None):
            return []
        return [PreAuthentication(self.security.check_call_metadata,
                                  token_authenticated=CONTROLLER_CALLS if internal else ())]

    async def _start_kafka_listener(self, forwarder: ControllerForwarder, name: str,
                                    listen: tuple[str, int], advertise: tuple[str, int],
                                    ssl_context: ssl.SSLContext | None) -> None:
        """Kafka's protocol on the same paths as gRPC, registered as listener ``name``, so
        Metadata answers its clients with every broker's address on that listener."""
        c = self.config
        assert self.replica_manager is not None  # start() made it before any listener
        if self.auto_create is None:  # one for every listener: one in-flight set
            self.auto_create = AutoTopicCreator(forwarder, self.supervisor,
                                                enabled=c.auto_create_topics_enable)
        services = Services(replica_manager=self.replica_manager,
                            metadata_cache=self.metadata_cache, controller=forwarder,
                            listener_name=name, topic_config_defaults=self._topic_config_defaults,
                            coordinators=self.coordinators,
                            auto_create=self.auto_create,
                            broker_configs=self._broker_configs,
                            cluster_default_configs=lambda: cluster_default_entries(
                                self._broker_configs(), self.metadata_cache.broker_configs()),
                            topic_default_sources=lambda: topic_default_sources(
                                self.config, self.metadata_cache.broker_configs()),
                            fetch_sessions=self.fetch_sessions)
        listener = KafkaListener(
            services, host=listen[0], port=listen[1],
            max_request_bytes=c.socket_request_max_bytes, supervisor=self.supervisor,
            unauthenticated_request_bytes_max=c.sasl_server_max_receive_size,
            observe=self._observe_kafka_request,
            ssl_context=ssl_context, security=self.security,
            quotas=self.connection_quotas,
            on_refused=lambda limit: self.metrics.kafka_connections_refused.labels(limit).inc(),
            on_idle_closed=self.metrics.kafka_connections_closed_idle.inc,
            on_failed_authentication=self.metrics.kafka_failed_authentications.inc)
        bound = await listener.start()
        self.kafka_listeners.append(listener)
        self.bound_ports[name] = bound
        host, port = advertise
        if self.controller_channel is None:
            raise InvariantViolation("a Kafka listener before the controller channel")
        self.controller_channel.listeners.append(
            pb.Listener(name=name, host=host, port=port or bound))
        sasl = ",".join(c.security.sasl_mechanisms)
        protocol = ("SASL_SSL" if sasl and ssl_context else "SASL_PLAINTEXT" if sasl
                    else "SSL" if ssl_context else "PLAINTEXT")
        described = ", ".join([name, protocol, *([sasl] if sasl else []),
                               f"authorizer {c.security.authorizer}"])
        log.info("broker %d serving Kafka's protocol (%s) on %s:%d", c.broker_id, described,
                 listen[0], bound)

    def _broker_configs(self) -> list[BrokerConfigEntry]:
        if self.log_manager is None:
            raise InvariantViolation("broker configs before the log manager")
        return broker_config_entries(self.config, self.log_manager.default_config,
                                     self.metadata_cache.broker_configs())

    def _described_topic_configs(self, topic: str) -> list[tuple[str, str, int]]:
        """``topic``'s configs and their sources as the Kafka listener's DescribeConfigs
        answers them (the gRPC DescribeTopicConfigs)."""
        entries = topic_config_entries(
            self.metadata_cache.topic_configs(topic), self._topic_config_defaults(), None,
            topic_default_sources(self.config, self.metadata_cache.broker_configs()))
        return [(e["name"], e["value"], e["config_source"]) for e in entries]

    def _topic_config_defaults(self) -> dict[str, str]:
        """What a topic that sets nothing gets here: the broker's log defaults, its
        replication settings (cleanup.policy and the cleaner's settings are log settings)."""
        c = self.config
        if self.log_manager is None:
            raise InvariantViolation("topic config defaults before the log manager")
        unclean = c.dynamic_topic_defaults.get("unclean.leader.election.enable",
                                               str(c.unclean_leader_election_enable).lower())
        return {**LogConfig.from_configs(c.log_config_overrides()).to_configs(),
                "min.insync.replicas": str(c.min_insync_replicas_for(None)),
                "unclean.leader.election.enable": unclean}

    def _observe_kafka_request(self, api: str, seconds: float, errors: list[int]) -> None:
        """Kafka requests in the broker's series, labelled ``kafka:<API>`` (Kafka's API
        names): request_latency_seconds (its count: requests), request_errors by code."""
        self.metrics.request_latency.labels(f"kafka:{api}").observe(seconds)
        for code in errors:
            self.metrics.request_errors.labels(f"kafka:{api}", code_name(code)).inc()

    async def _controller_session(self, channel: ControllerChannel) -> None:
        try:
            await channel.register()
        except DuplicateBrokerRegistrationError as e:
            # An operator's mistake, not a bug: one clear line and exit, no traceback.
            log.critical("%s", e)
            self.supervisor.fail(e)
            return
        self._coordinators_task = self.supervisor.spawn(
            self._build_coordinators_once_serving(channel), "coordinators")
        await channel.run_heartbeats()

    async def _serve_metrics(self) -> None:
        """Answer /metrics once this broker serves (``settled``), or after ``METRICS_SERVE_WAIT_S_MAX``
        without (a broker that cannot reach its controller is the one to look at). Why
        wait: prometheus_client and the http.server stack under it are 20-25 ms of CPU
        to import, on the thread that registers and takes the leadership that make the
        broker serve (issue 30's restart time); scrapes meanwhile wait in the backlog.
        The imports run in a worker thread: on the loop they would hold up the first
        answers after serving as long."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(METRICS_SERVE_WAIT_S_MAX):
                await self.settled.wait()
        c = self.config
        # With TLS, /metrics is HTTPS with this broker's certificate, as every port.
        # In secure mode only to a scraper with a certificate of the CA or a user's
        # password (HTTP Basic), checked against the SCRAM credentials as PLAIN is.
        await asyncio.to_thread(functools.partial(
            self.metrics.serve, tls=c.tls, secured=self.security.secured,
            check_password=self.security.password_ok))

    async def _build_coordinators_once_serving(self, channel: ControllerChannel) -> None:
        """Build the coordinators (their leadership scans and timers start) once this
        broker serves, unless a request built them already. Serving: a heartbeat has
        unfenced us and the controller's metadata names us; the LeaderAndIsr that makes us
        lead a coordinator topic's partitions comes with it. Before, their imports (some
        20 ms of CPU) would only put off the answers that make the broker serve (issue
        30's restart time); once unfenced alone was measured too early for that. Sets
        ``serving`` first, and ``settled`` before the build; then the log cleaner is made
        (``BackgroundWork.make_cleaner``), in a worker thread."""
        while channel.is_fenced or self.metadata_cache.endpoint(self.config.broker_id) is None:
            await asyncio.sleep(SERVING_POLL_S)
        self.serving.set()
        # That work is some 75 ms of CPU on this thread (imports, a full collection): at
        # once, it held up the first answers after serving as long (issue 30, restart time).
        await asyncio.sleep(SETTLE_AFTER_SERVING_S)
        self.settled.set()
        if self.coordinators is not None:
            self.coordinators.ensure_built()
        if self.replica_manager is not None:
            await self.replica_manager.background.make_cleaner()

    async def shutdown(self) -> None:
        c = self.config
        channel = self.controller_channel
        if channel is not None and channel.broker_epoch >= 0:
            log.info("controlled shutdown: asking the controller to move leadership away")
            moved = await channel.controlled_shutdown(c.controlled_shutdown_timeout_ms)
            log.info("controlled shutdown %s", "done" if moved else "timed out")
        # No coordinators built from here on but by a request: shutdown stops them once.
        tasks = [t for t in (self._controller_task, self._coordinators_task,
                             self._metrics_task) if t is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if self.replica_manager is not None:
            # Long-polls and ReplicaFetch streams would otherwise hold the servers' grace.
            self.replica_manager.answer_long_polls()
        await asyncio.gather(*(s.stop(SERVER_GRACE_S) for s in self.servers),
                             return_exceptions=True)
        await asyncio.gather(*(k.stop() for k in self.kafka_listeners), return_exceptions=True)
        self.security.close()  # the password threads: no listener left to ask them
        built = self.coordinators.built if self.coordinators is not None else None
        if built is not None:
            await built[1].stop()
        if self.marker_sender is not None:
            await self.marker_sender.close()
        if built is not None:
            await built[0].stop()
        if self.replica_manager is not None:
            await self.replica_manager.stop()
            self.replica_manager.checkpoint_high_watermarks()
        if self.log_manager is not None:
            self.log_manager.shutdown()
        if channel is not None:
            await channel.close()
        await self.supervisor.stop()  # what is left (none after the replica manager's stop)
        self.metrics.stop()
        log.info("broker %d stopped", c.broker_id)
