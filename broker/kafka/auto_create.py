"""Topic auto-creation for Kafka clients (``auto.create.topics.enable``), Kafka's semantics.

Kafka's KRaft broker (``AutoTopicCreationManager``) creates a topic a client
names in a Metadata request when the broker has ``auto.create.topics.enable``
(default true) and the request allows it (``allow_auto_topic_creation``,
Metadata v4+; older versions always allow it). The broker sends CreateTopics
to the controller in the background and answers the topic at once with
UNKNOWN_TOPIC_OR_PARTITION (retriable): the client asks again and finds the
topic once the controller's decision has reached this broker's metadata cache.
The topic gets the controller's ``num.partitions`` and
``default.replication.factor`` (CreateTopics with -1 for both, KIP-464) and
the controller's default topic configs.

Here a Produce to an unknown topic starts the same creation (Kafka's Produce
only answers UNKNOWN_TOPIC_OR_PARTITION; a client producing without Metadata
first is rare, but it gets its topic the same way). The answer is Kafka's.

Not created: a name Kafka refuses (INVALID_TOPIC_EXCEPTION, checked here
before anything is sent) and internal topics (``__consumer_offsets`` is the
group coordinator's to create, with its own settings). The controller checks
everything else (a name colliding with another on '.' vs '_', a replication
factor above the live brokers); a refusal there is logged and the client keeps
seeing UNKNOWN_TOPIC_OR_PARTITION, as with Kafka.

Authorization is the caller's (``apis``): creating needs CREATE on the cluster
or on the topic, as Kafka's CreateTopics; a principal that may DESCRIBE the
topic but not CREATE it sees TOPIC_AUTHORIZATION_FAILED.

Limits: a name is in flight once (a second request for it while its creation
is pending sends nothing), and at most ``IN_FLIGHT_MAX`` names are in flight;
beyond, nothing is sent until some finish (the client retries).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

from tidewater.broker.servicers.admin_forwarding import ControllerForwarder
from tidewater.broker.storage.topics import INTERNAL_TOPICS, validate_topic_name
from tidewater.proto import tidewater_pb2 as pb
from tidewater.proto.errors import InvalidTopicError, InvariantViolation
from tidewater.proto.forwarded_principal import FORWARDED
from tidewater.proto.supervisor import TaskSupervisor

log = logging.getLogger("tidewater.broker.auto_create")

IN_FLIGHT_MAX = 1000
# How long the controller has to decide one creation (the forwarder adds its margin).
CREATE_TIMEOUT_MS = 30_000


def name_refusal(name: str) -> str | None:
    """Why Kafka would refuse to create ``name`` (None: it may be created)."""
    try:
        validate_topic_name(name)
    except InvalidTopicError as e:
        return str(e)
    return None


class AutoTopicCreator:
    """One per broker: sends the creations, remembers which are in flight."""

    def __init__(self, controller: ControllerForwarder, supervisor: TaskSupervisor, *,
                 enabled: bool) -> None:
        self.controller = controller
        self.supervisor = supervisor
        self.enabled = enabled
        self._in_flight: set[str] = set()

    def in_flight(self) -> frozenset[str]:
        return frozenset(self._in_flight)

    def maybe_create(self, names: Iterable[str]) -> list[str]:
        """Start creating each name that may be created and is not in flight yet; returns
        the names sent. Callers have checked authorization and that the topics are unknown."""
        if not self.enabled:
            return []
        sent: list[str] = []
        for name in dict.fromkeys(names):
            if (name in self._in_flight or name in INTERNAL_TOPICS
                    or name_refusal(name) is not None
                    or len(self._in_flight) >= IN_FLIGHT_MAX):
                continue
            self._in_flight.add(name)
            sent.append(name)
        if sent:
            request = pb.CreateTopicsRequest(timeout_ms=CREATE_TIMEOUT_MS)
            for name in sent:
                request.topics.add(name=name, num_partitions=-1, replication_factor=-1)
            self.supervisor.spawn(self._create(request), f"auto-create-{sent[0]}")
        return sent

    async def _create(self, request: pb.CreateTopicsRequest) -> None:
        # The broker's own call, for names several clients may have asked for (each one's
        # CREATE was checked before): the controller checks this broker, not the client
        # whose request happened to spawn this task.
        FORWARDED.set(None)
        try:
            # The forwarder answers NOT_CONTROLLER when the controller cannot be reached.
            response = await self.controller.CreateTopics(request, None)
        except InvariantViolation:
            raise  # a bug: the supervisor stops the broker
        except Exception as e:  # e.g. the channel closing: the client asks again
            log.warning("auto-creating %s failed: %r", ", ".join(t.name for t in request.topics),
                        e)
            return
        finally:
            for t in request.topics:
                self._in_flight.discard(t.name)
        for r in response.topics:
            if r.error_code == pb.NONE:
                log.info("auto-created topic %s: %d partitions, replication factor %d",
                         r.name, r.num_partitions, r.replication_factor)
            elif r.error_code != pb.TOPIC_ALREADY_EXISTS:  # another broker was first
                log.warning("auto-creating topic %s failed: %s %s", r.name,
                            pb.ErrorCode.Name(r.error_code), r.error_message)
