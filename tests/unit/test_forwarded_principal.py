"""The principal a broker names when it forwards an admin call (proto/forwarded_principal)."""

import asyncio

import pytest

from tidewater.proto.forwarded_principal import (
    FORWARDED,
    HOST_KEY,
    PRINCIPAL_KEY,
    forwarded_metadata,
    forwarded_of,
)

pytestmark = pytest.mark.timeout(30)


def test_unset_names_no_one():
    assert forwarded_metadata() == ()
    assert forwarded_of([("authorization", "PLAIN x")]) is None


def test_what_a_task_sets_travels_to_its_children_and_back_as_metadata():
    async def request() -> tuple:
        FORWARDED.set(("User:alice", "10.0.0.7"))
        child = asyncio.ensure_future(asyncio.sleep(0, result=None))
        await child
        return await asyncio.ensure_future(_metadata_later())

    async def _metadata_later() -> tuple:
        return forwarded_metadata()

    metadata = asyncio.run(request())
    assert metadata == ((PRINCIPAL_KEY, "User:alice"), (HOST_KEY, "10.0.0.7"))
    assert forwarded_of(list(metadata)) == ("User:alice", "10.0.0.7")
    assert forwarded_metadata() == ()  # the request's task kept it to itself


@pytest.mark.parametrize("principal", ["alice", "Group:x", "User:" + "a" * 400, "User:a\nb"])
def test_a_malformed_principal_is_refused(principal):
    with pytest.raises(ValueError):
        forwarded_of([(PRINCIPAL_KEY, principal)])


def test_bytes_values_are_decoded():
    assert forwarded_of([(PRINCIPAL_KEY, b"User:bob")]) == ("User:bob", "")
