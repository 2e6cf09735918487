"""DescribeGroups answers a coordinator error per group, not in a top-level error code:
the admin asks again (finding the coordinator again) until the group is described or
its deadline passes, as Kafka's admin client does."""

import pytest

from tidewater.client.group import CoordinatorClient
from tidewater.client.group_admin import GroupAdmin
from tidewater.proto import tidewater_pb2 as pb
from tidewater.proto.errors import CoordinatorLoadInProgressError


class LoadingCoordinator(CoordinatorClient):
    """A coordinator whose group answers ``loading_for`` DescribeGroups with
    COORDINATOR_LOAD_IN_PROGRESS (its partition is still being loaded) first."""

    def __init__(self, loading_for: int):
        super().__init__(metadata=None, group_id="g", request_timeout_s=1,  # type: ignore[arg-type]
                         retry_backoff_s=0.001)
        self.loading_for = loading_for
        self.asked = 0
        self.found = 0

    def find(self):
        self.found += 1
        return ("127.0.0.1", 1)

    def call(self, method, request, extra_timeout_s=0.0):
        assert method == "DescribeGroups"
        self.find()
        self.asked += 1
        code = pb.COORDINATOR_LOAD_IN_PROGRESS if self.asked <= self.loading_for else pb.NONE
        return pb.DescribeGroupsResponse(groups=[pb.GroupDescription(
            group_id="g", error_code=code, state="" if code else "Empty")])


def admin(timeout_s: float) -> GroupAdmin:
    made = object.__new__(GroupAdmin)  # no cluster: the coordinator is the fake above
    made.request_timeout_s = timeout_s
    return made


def test_a_group_still_loading_is_asked_again_until_described():
    coordinator = LoadingCoordinator(loading_for=3)
    described = admin(5)._described(coordinator)
    assert (described.error_code, described.state) == (pb.NONE, "Empty")
    assert coordinator.asked == 4 and coordinator.found == 4


def test_a_group_loading_past_the_deadline_is_a_typed_error():
    coordinator = LoadingCoordinator(loading_for=10**9)
    with pytest.raises(CoordinatorLoadInProgressError, match="DescribeGroups of 'g'"):
        admin(0.2)._described(coordinator)
    assert coordinator.asked > 1
