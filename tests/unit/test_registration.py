"""The registration rules (broker/controller_link/registration.py), called directly: the
broker's ControllerChannel and the simulation's broker both keep a Registration."""

import pytest

from tidewater.broker.controller_link.registration import REGISTER_AGAIN, Registration
from tidewater.proto import tidewater_pb2 as pb

SESSION_MS = 600


def registered(epoch=7, token=b"t" * 16):
    r = Registration(session_timeout_ms=SESSION_MS)
    assert r.on_register_answer(pb.RegisterBrokerResponse(
        error_code=pb.NONE, broker_epoch=epoch, control_token=token, cluster_id="c"))
    return r


def heartbeat(error=pb.NONE, fenced=False):
    return pb.BrokerHeartbeatResponse(error_code=error, is_fenced=fenced)


def test_a_refused_registration_leaves_it_unregistered():
    r = Registration(session_timeout_ms=SESSION_MS)
    assert not r.on_register_answer(pb.RegisterBrokerResponse(
        error_code=pb.DUPLICATE_BROKER_REGISTRATION, broker_epoch=9, control_token=b"x"))
    assert not r.registered and r.broker_epoch == -1 and r.control_token == b""


def test_begin_forgets_the_old_registration():
    r = registered()
    assert r.registered and r.heartbeat_request(1).control_token == b"t" * 16
    r.begin()
    assert not r.registered and r.control_token == b""
    assert r.heartbeat_request(1).broker_epoch == -1


@pytest.mark.parametrize("error", REGISTER_AGAIN)
def test_answers_saying_the_controller_forgot_us_register_again(error):
    assert registered().on_heartbeat_answer(heartbeat(error), 0)


def test_other_errors_do_not_register_again():
    assert not registered().on_heartbeat_answer(heartbeat(pb.NOT_CONTROLLER), 0)


def test_fenced_for_two_session_timeouts_registers_again():
    r = registered()
    assert not r.on_heartbeat_answer(heartbeat(fenced=True), 1000)
    assert r.is_fenced
    assert not r.on_heartbeat_answer(heartbeat(fenced=True), 1000 + 2 * SESSION_MS)
    assert r.on_heartbeat_answer(heartbeat(fenced=True), 1001 + 2 * SESSION_MS)
    # Unfenced in between: the clock starts again.
    r = registered()
    r.on_heartbeat_answer(heartbeat(fenced=True), 0)
    assert not r.on_heartbeat_answer(heartbeat(fenced=False), 500) and not r.is_fenced
    assert not r.on_heartbeat_answer(heartbeat(fenced=True), 1300)
    assert not r.on_heartbeat_answer(heartbeat(fenced=True), 1300 + 2 * SESSION_MS)


def test_a_duplicate_registration_is_retried_for_two_session_timeouts_then_given_up():
    r = Registration(session_timeout_ms=SESSION_MS)
    duplicate = pb.RegisterBrokerResponse(error_code=pb.DUPLICATE_BROKER_REGISTRATION,
                                          broker_epoch=-1)
    assert not r.duplicate_wait_over(duplicate, 1000)
    assert not r.duplicate_wait_over(duplicate, 1000 + 2 * SESSION_MS)
    assert r.duplicate_wait_over(duplicate, 1001 + 2 * SESSION_MS)
    # Another answer in between (the controller was unreachable, or took us): the clock
    # starts again.
    r = Registration(session_timeout_ms=SESSION_MS)
    assert not r.duplicate_wait_over(duplicate, 0)
    assert not r.duplicate_wait_over(pb.RegisterBrokerResponse(error_code=pb.INVALID_REQUEST),
                                     100)
    assert not r.duplicate_wait_over(duplicate, 1 + 2 * SESSION_MS)
    assert not r.duplicate_wait_over(duplicate, 100 + 2 * SESSION_MS)
