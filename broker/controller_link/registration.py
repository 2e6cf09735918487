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
- ``duplicate_wait_over``: DUPLICATE_BROKER_REGISTRATION says another live
  process holds this broker ID. The caller retries for up to two session
  timeouts (what a restarted controller gives the old session, so a broker
  restarted right after a crash its controller has not yet noticed still
  comes up) and then gives up: the process exits instead of retrying for ever
  as a broker that may never serve.
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
        self._duplicate_since_ms: int | None = None  # first DUPLICATE_BROKER_REGISTRATION

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
        self._duplicate_since_ms = None
        self.broker_epoch = response.broker_epoch
        self.control_token = response.control_token
        self.cluster_id = response.cluster_id
        self._fenced_since_ms = None
        return True

    def duplicate_wait_over(self, response: pb.RegisterBrokerResponse, now_ms: int) -> bool:
        """After a refused registration: True when it was DUPLICATE_BROKER_REGISTRATION for
        longer than two session timeouts (give up); False to retry."""
        if response.error_code != pb.DUPLICATE_BROKER_REGISTRATION:
            self._duplicate_since_ms = None
            return False
        if self._duplicate_since_ms is None:
            self._duplicate_since_ms = now_ms
        return now_ms - self._duplicate_since_ms > 2 * self.session_timeout_ms

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
