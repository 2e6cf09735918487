"""This broker's registration with the controller: its epoch, its control token, fencing.

A plain class (no I/O, time passed in) that the broker's ``ControllerChannel``
and the simulation's broker both keep, so the rules below have one place:

- ``begin()``: a registration is under way. The broker epoch is -1 and the
  control token empty until the answer is here, so the controller's requests
  are answered "try again" meanwhile (``control_rules``): a new process must
  not act on states meant for its previous one.
- ``on_register_answer``: NONE makes the answer's broker epoch, control token
  and cluster ID this registration's; anything else leaves it unregistered (the
  caller retries).
- ``on_heartbeat_answer``: does the controller still know this registration?
  STALE_BROKER_EPOCH, BROKER_ID_NOT_REGISTERED or CLUSTER_AUTHORIZATION_FAILED
  say it does not: register again (the controller then resends the full
  LeaderAndIsr for our partitions). A broker kept fenced for two session
  timeouts registers again too, as a safety net (a heartbeat from a fenced
  broker normally unfences it).
"""

from __future__ import annotations

from tidewater.proto import tidewater_pb2 as pb

UNREGISTERED = -1
# Heartbeat answers saying the controller does not know this registration.
REGISTER_AGAIN = (pb.STALE_BROKER_EPOCH, pb.BROKER_ID_NOT_REGISTERED,
                  pb.CLUSTER_AUTHORIZATION_FAILED)


class Registration:
    def __init__(self, *, session_timeout_ms: int):
        self.session_timeout_ms = session_timeout_ms
        self.broker_epoch = UNREGISTERED
        self.control_token = b""  # RegisterBrokerResponse.control_token
        self.cluster_id = ""
        self.is_fenced = True
        self._fenced_since_ms: int | None = None

    @property
    def registered(self) -> bool:
        return self.broker_epoch != UNREGISTERED

    def begin(self) -> None:
        """A registration is under way: nothing of the old one is believed any more."""
        self.broker_epoch = UNREGISTERED
        self.control_token = b""

    def on_register_answer(self, response: pb.RegisterBrokerResponse) -> bool:
        """True when the controller accepted: this is now the registration."""
        if response.error_code != pb.NONE:
            return False
        self.broker_epoch = response.broker_epoch
        self.control_token = response.control_token
        self.cluster_id = response.cluster_id
        self._fenced_since_ms = None
        return True

    def on_heartbeat_answer(self, response: pb.BrokerHeartbeatResponse, now_ms: int) -> bool:
        """Take a heartbeat's answer; True when this broker must register again."""
        self.is_fenced = response.is_fenced
        if response.error_code in REGISTER_AGAIN:
            return True
        if response.error_code != pb.NONE:
            return False
        if not response.is_fenced:
            self._fenced_since_ms = None
            return False
        if self._fenced_since_ms is None:
            self._fenced_since_ms = now_ms
        return now_ms - self._fenced_since_ms > 2 * self.session_timeout_ms

    def heartbeat_request(self, broker_id: int, *, want_shutdown: bool = False
                          ) -> pb.BrokerHeartbeatRequest:
        return pb.BrokerHeartbeatRequest(broker_id=broker_id, broker_epoch=self.broker_epoch,
                                         want_shutdown=want_shutdown,
                                         control_token=self.control_token)
