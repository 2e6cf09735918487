"""Kafka's admin APIs that change configs and leaders, forwarded to the controller.

AlterConfigs (key 33) v0-2 and IncrementalAlterConfigs (key 44) v0-1 (v2 and v1
flexible): each resource becomes one ``ConfigResourceAlteration`` of one
``AlterConfigs`` call to the controller (``controller/config_changes.py`` holds
the rules: replace vs SET/DELETE/APPEND/SUBTRACT, validation, per-resource
errors). With an authorizer, a topic needs ALTER_CONFIGS on it
(TOPIC_AUTHORIZATION_FAILED) and a broker resource ALTER_CONFIGS on the cluster
(CLUSTER_AUTHORIZATION_FAILED), as Kafka's; refused resources are not forwarded.

ElectLeaders (key 43) v0-2: the named partitions (null: all of them) go to the
controller's ``ElectLeaders``; v0 is always a preferred election (it has no
election type). Needs ALTER on the cluster: every partition
CLUSTER_AUTHORIZATION_FAILED otherwise (and the top-level error from v1).
"""

from __future__ import annotations

from collections.abc import Awaitable
from typing import Any, Protocol

from tidewater.broker.kafka.codec import RequestBody, RequestHead, milliseconds
from tidewater.broker.servicers.admin_forwarding import ControllerForwarder
from tidewater.proto import tidewater_pb2 as pb
from tidewater.proto.acls import ALTER, ALTER_CONFIGS, CLUSTER, CLUSTER_NAME, TOPIC

ALTER_CONFIGS_KEY, ELECT_LEADERS, INCREMENTAL_ALTER_CONFIGS = 33, 43, 44
SUPPORTED = {ALTER_CONFIGS_KEY: (0, 2), ELECT_LEADERS: (0, 2), INCREMENTAL_ALTER_CONFIGS: (0, 1)}
TOPIC_RESOURCE = 2
ELECTION_PREFERRED = 0


class ConfigServices(Protocol):
    """What these APIs reach of ``apis.Services``."""

    @property
    def controller(self) -> ControllerForwarder: ...

    def allowed(self, operation: int, resource_type: int, name: str) -> bool: ...


def _alterations(resource: Any, incremental: bool) -> list[pb.ConfigAlteration]:
    return [pb.ConfigAlteration(name=c.name, value=c.value or "", value_null=c.value is None,
                                operation=c.config_operation if incremental else 0)
            for c in resource.configs]


async def _alter(s: ConfigServices, body: RequestBody, incremental: bool
                 ) -> Awaitable[dict[str, Any]]:
    request = pb.AlterConfigsRequest(validate_only=body.validate_only, incremental=incremental)
    refused: list[dict[str, Any]] = []
    for resource in body.resources:
        topic = resource.resource_type == TOPIC_RESOURCE
        if not s.allowed(ALTER_CONFIGS, TOPIC if topic else CLUSTER,
                         resource.resource_name if topic else CLUSTER_NAME):
            refused.append({
                "resource_type": resource.resource_type, "resource_name": resource.resource_name,
                "error_code": pb.TOPIC_AUTHORIZATION_FAILED if topic
                else pb.CLUSTER_AUTHORIZATION_FAILED,
                "error_message": "needs ALTER_CONFIGS on the " + ("topic" if topic else "cluster")})
            continue
        request.resources.add(resource_type=resource.resource_type,
                              resource_name=resource.resource_name,
                              alterations=_alterations(resource, incremental))

    async def answer() -> dict[str, Any]:
        response = (await s.controller.AlterConfigs(request, None) if request.resources
                    else pb.AlterConfigsResponse())
        results = [{"resource_type": r.resource_type, "resource_name": r.resource_name,
                    "error_code": r.error_code, "error_message": r.error_message or None}
                   for r in response.results]
        return {"throttle_time": 0, "responses": results + refused}
    return answer()


async def on_alter_configs(s: ConfigServices, head: RequestHead, body: RequestBody
                           ) -> Awaitable[dict[str, Any]]:
    return await _alter(s, body, incremental=False)


async def on_incremental_alter_configs(s: ConfigServices, head: RequestHead, body: RequestBody
                                       ) -> Awaitable[dict[str, Any]]:
    return await _alter(s, body, incremental=True)


async def on_elect_leaders(s: ConfigServices, head: RequestHead, body: RequestBody
                           ) -> Awaitable[dict[str, Any]]:
    election_type = getattr(body, "election_type", ELECTION_PREFERRED)
    request = pb.ElectLeadersRequest(election_type=election_type,
                                     timeout_ms=milliseconds(body.timeout),
                                     all_partitions=body.topic_partitions is None)
    for t in body.topic_partitions or ():
        for number in t.partitions:
            request.partitions.add(topic=t.topic, partition=number)
    if not s.allowed(ALTER, CLUSTER, CLUSTER_NAME):
        denied = {"throttle_time": 0, "error_code": pb.CLUSTER_AUTHORIZATION_FAILED,
                  "replica_election_results": [
                      {"topic": t.topic, "partition_result": [
                          {"partition_id": n, "error_code": pb.CLUSTER_AUTHORIZATION_FAILED,
                           "error_message": "needs ALTER on the cluster"}
                          for n in t.partitions]} for t in body.topic_partitions or ()]}

        async def refused() -> dict[str, Any]:
            return denied
        return refused()

    async def answer() -> dict[str, Any]:
        response = await s.controller.ElectLeaders(request, None)
        grouped: dict[str, list[dict[str, Any]]] = {}
        for r in response.results:
            grouped.setdefault(r.topic, []).append({
                "partition_id": r.partition, "error_code": r.error_code,
                "error_message": r.error_message or None})
        if response.error_code != pb.NONE and not grouped:
            # The controller refused the whole request: each named partition says so (v0
            # has no top-level error).
            for item in request.partitions:
                grouped.setdefault(item.topic, []).append({
                    "partition_id": item.partition, "error_code": response.error_code,
                    "error_message": None})
        return {"throttle_time": 0, "error_code": response.error_code,
                "replica_election_results": [{"topic": topic, "partition_result": parts}
                                             for topic, parts in grouped.items()]}
    return answer()


HANDLERS = {ALTER_CONFIGS_KEY: on_alter_configs, INCREMENTAL_ALTER_CONFIGS:
            on_incremental_alter_configs, ELECT_LEADERS: on_elect_leaders}
API_NAMES = {ALTER_CONFIGS_KEY: "AlterConfigs", INCREMENTAL_ALTER_CONFIGS:
             "IncrementalAlterConfigs", ELECT_LEADERS: "ElectLeaders"}
