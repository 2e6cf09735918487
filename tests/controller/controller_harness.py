"""A controller state machine on a real metadata log, driven synchronously (no sockets)."""

from tidewater.controller.config import ControllerConfig
from tidewater.controller.metadata_log import MetadataLog
from tidewater.controller.owner import MetadataOwner
from tidewater.controller.state_machine import ControllerStateMachine
from tidewater.proto import tidewater_pb2 as pb


class Harness:
    def __init__(self, data_dir, settings=(), now_ms=1_000_000):
        self.data_dir = data_dir
        self.settings = list(settings)
        self.config = ControllerConfig(data_dir=data_dir)
        self.config.apply_settings(self.settings)
        self.log = MetadataLog.open(data_dir)
        self.machine = ControllerStateMachine(self.config)
        self.effects = []
        self.fatal = []  # what the owner's on_fatal hook received (a process would exit)
        self.now_ms = now_ms
        self.owner = MetadataOwner(self.log, self.machine, on_commit=self.effects.append,
                                   on_fatal=self.fatal.append,
                                   clock_ms=lambda: self.now_ms)
        self.replayed = self.owner.recover()
        self.owner.run_now(self.machine.start)
        self.epochs = {}

    @property
    def metadata(self):
        return self.machine.metadata

    def restart(self):
        self.log.close()
        return Harness(self.data_dir, self.settings, self.now_ms)

    def run(self, method, request):
        return self.owner.run_now(lambda tx, now: method(tx, now, request))

    def register(self, broker_id, incarnation="inc-1", port=None, rack=""):
        response = self.run(self.machine.register_broker, pb.RegisterBrokerRequest(
            broker_id=broker_id, incarnation_id=incarnation,
            listeners=[pb.Listener(name="INTERNAL", host="127.0.0.1",
                                   port=port or 20000 + broker_id)], rack=rack))
        if response.error_code == pb.NONE:
            self.epochs[broker_id] = response.broker_epoch
        return response

    def token(self, broker_id):
        """The control token of ``broker_id``'s current registration (b"" if none)."""
        broker = self.metadata.brokers.get(broker_id)
        return broker.control_token if broker is not None else b""

    def heartbeat(self, broker_id, *, epoch=None, want_shutdown=False, token=None):
        return self.run(self.machine.broker_heartbeat, pb.BrokerHeartbeatRequest(
            broker_id=broker_id, broker_epoch=self.epochs.get(broker_id, -1) if epoch is None else epoch,
            want_shutdown=want_shutdown,
            control_token=self.token(broker_id) if token is None else token))

    def heartbeat_all(self, *except_ids):
        for broker_id in self.epochs:
            if broker_id not in except_ids:
                self.heartbeat(broker_id)

    def advance(self, ms, *silent):
        """Move time in small steps; everyone but ``silent`` heartbeats; sessions are checked."""
        fenced = []
        step = 100
        for _ in range(0, ms, step):
            self.now_ms += step
            self.heartbeat_all(*silent)
            fenced += self.owner.run_now(self.machine.check_sessions)
        return fenced

    def end_session(self, broker_id):
        """The registered process of ``broker_id`` went silent: time passes (the others
        heartbeat) until its session expired and it was fenced, so that a new incarnation
        may register (a live one's registration is DUPLICATE_BROKER_REGISTRATION)."""
        timeout_ms = self.config.broker_session_timeout_ms
        for _ in range(2):  # one session timeout, and a step to spare
            if not self.machine.sessions.alive(broker_id, self.now_ms):
                return
            self.advance(timeout_ms + 100, broker_id)
        if not self.machine.sessions.alive(broker_id, self.now_ms):
            return
        raise AssertionError(f"broker {broker_id}'s session did not end")

    def create(self, name, partitions=1, rf=1, configs=None, validate_only=False):
        response = self.run(self.machine.create_topics, pb.CreateTopicsRequest(
            topics=[pb.CreatableTopic(name=name, num_partitions=partitions, replication_factor=rf,
                                      configs=configs or {})], validate_only=validate_only))
        return response.topics[0]

    def alter(self, broker_id, p, new_isr, *, leader_epoch=None, partition_epoch=None,
              broker_epoch=None, member_epochs=None, token=None):
        """``member_epochs``: the broker epochs the members fetched with (KIP-903); by
        default each member's registered epoch, as a correct leader reports them."""
        if member_epochs is None:
            member_epochs = [self.epochs.get(b, -1) for b in new_isr]
        response = self.run(self.machine.alter_partition, pb.AlterPartitionRequest(
            broker_id=broker_id,
            broker_epoch=self.epochs[broker_id] if broker_epoch is None else broker_epoch,
            items=[pb.AlterPartitionItem(
                topic=p.topic, partition=p.partition,
                leader_epoch=p.leader_epoch if leader_epoch is None else leader_epoch,
                partition_epoch=p.partition_epoch if partition_epoch is None else partition_epoch,
                new_isr=new_isr, new_isr_broker_epochs=member_epochs)],
            control_token=self.token(broker_id) if token is None else token))
        return response

    def describe(self):
        return self.run(self.machine.describe_cluster, pb.DescribeClusterRequest())

    def partition(self, topic, number=0):
        return self.metadata.partition(topic, number)
