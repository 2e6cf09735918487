"""client.consumer._FollowingFetch: the hand-over between a waiting poll and the loop
thread that follows the answer (sends the next fetch) before waking it."""

from __future__ import annotations

import threading
import types

from tidewater.client.consumer import _FollowingFetch, _wait_done


class FakeConsumer:
    """Records what the loop thread follows; ``gate`` holds it inside ``_follow``."""

    def __init__(self):
        self.followed = []
        self.gate = threading.Event()
        self.gate.set()

    def _follow(self, call, response):
        self.gate.wait(10)
        self.followed.append(response)
        call.follow = ("next", [])


def fetch(consumer):
    stream = types.SimpleNamespace(_io=types.SimpleNamespace(thread=threading.main_thread()),
                                   address=("127.0.0.1", 1))
    return _FollowingFetch(consumer, (), stream, request=object())


def test_the_loop_follows_only_an_answer_a_poll_waits_for():
    consumer = FakeConsumer()
    unwatched = fetch(consumer)
    unwatched.on_answer("answer", None)
    assert consumer.followed == [] and unwatched.follow is None
    assert _wait_done(unwatched, 0, follow=True)

    watched = fetch(consumer)
    waiter = threading.Thread(target=lambda: _wait_done(watched, 10, follow=True))
    waiter.start()
    while not watched._waiting:
        pass
    watched.on_answer("answer", None)
    waiter.join(10)
    assert consumer.followed == ["answer"] and watched.follow == ("next", [])


def test_an_error_answer_is_not_followed():
    consumer = FakeConsumer()
    call = fetch(consumer)
    call.begin_wait()
    call.on_answer(None, RuntimeError("broken"))
    assert not call.end_wait()
    assert consumer.followed == []


def test_a_poll_timing_out_as_the_loop_takes_the_answer_waits_for_its_follow_up():
    """The poll's wait ends while the loop thread is inside ``_follow``: the poll must
    not return 'not answered' (it would keep the call and could miss the follow-up it
    has to adopt or withdraw); it waits the moment the loop takes and sees both."""
    consumer = FakeConsumer()
    consumer.gate.clear()  # the loop thread will stop inside _follow
    call = fetch(consumer)
    result = {}
    poll = threading.Thread(target=lambda: result.update(
        answered=_wait_done(call, 0.2, follow=True)))
    poll.start()
    while not call._waiting:
        pass
    loop = threading.Thread(target=call.on_answer, args=("answer", None))
    loop.start()  # takes the answer (the poll waits), then stops at the gate
    poll.join(1.0)
    assert poll.is_alive()  # its 0.2 s are over: it waits for the hand-over
    consumer.gate.set()
    loop.join(10)
    poll.join(10)
    assert result == {"answered": True}
    assert call.follow == ("next", [])
