"""AlterConfigs and IncrementalAlterConfigs: a resource's own configs, changed in the log.

A TOPIC resource's own configs are its ``TopicInfo.configs`` (what CreateTopics
stored); a BROKER resource's are the dynamic broker configs of one broker (its
id in decimal) or of every broker (the name "", Kafka's ``--entity-default``).
Either way a change is one ``configs_altered`` record carrying the resource's
whole new map, so replay needs no merge logic:

    {"type": "configs_altered", "resource_type": 2 | 4, "name": str,
     "configs": {str: str}}

The rules, as Kafka's (``ConfigAdminManager``, ``ConfigurationControlManager``):

- AlterConfigs (not incremental) replaces the resource's own configs with the
  given ones (a null value is left out); IncrementalAlterConfigs applies each
  alteration to the current map: SET puts the value, DELETE removes the key
  (the default applies again), APPEND adds list items not yet there, SUBTRACT
  removes list items. APPEND and SUBTRACT start from the current value, or the
  default when the resource has none; they are for list configs only
  (INVALID_CONFIG otherwise).
- A resource named twice in one request: INVALID_REQUEST for each; a config
  named twice in one resource (incremental): INVALID_REQUEST.
- An unknown topic: UNKNOWN_TOPIC_OR_PARTITION. A broker id of no registered
  broker, or not a number: INVALID_REQUEST. Other resource types: INVALID_REQUEST.
- Topic configs are checked by the parser CreateTopics uses (INVALID_CONFIG,
  naming the config); broker configs must be dynamic ones
  (``proto.broker_dynamic_config``; any other: INVALID_REQUEST) with a value
  valid for the topic config they default.
- Nothing of a resource is changed unless all its alterations pass; each
  resource succeeds or fails on its own; ``validate_only`` appends nothing.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping
from typing import Any

from tidewater.controller.metadata import ClusterMetadata
from tidewater.controller.metadata_log import MetadataRecord
from tidewater.proto import tidewater_pb2 as pb
from tidewater.proto.broker_dynamic_config import (
    CLUSTER_DEFAULT,
    DYNAMIC_BROKER_CONFIGS,
    is_dynamic_broker_config,
    validate_dynamic_broker_config,
)
from tidewater.proto.errors import (
    InvalidConfigError,
    InvalidRequestError,
    TidewaterError,
    UnknownTopicOrPartitionError,
)
from tidewater.proto.topic_config import TOPIC_CONFIGS, LogConfig, validate_topic_configs

TOPIC_RESOURCE, BROKER_RESOURCE = 2, 4
SET, DELETE, APPEND, SUBTRACT = 0, 1, 2, 3
OPERATION_NAMES = {SET: "SET", DELETE: "DELETE", APPEND: "APPEND", SUBTRACT: "SUBTRACT"}
RESOURCES_PER_REQUEST_MAX = 10_000
ALTERATIONS_PER_RESOURCE_MAX = 1_000


def configs_altered_record(resource_type: int, name: str,
                           configs: Mapping[str, str]) -> MetadataRecord:
    return {"type": "configs_altered", "resource_type": resource_type, "name": name,
            "configs": dict(sorted(configs.items()))}


def _is_list(resource_type: int, name: str) -> bool:
    topic_name = name if resource_type == TOPIC_RESOURCE else DYNAMIC_BROKER_CONFIGS.get(name)
    definition = TOPIC_CONFIGS.get(topic_name or "")
    return definition is not None and definition.type == "list"


def _list_default(resource_type: int, name: str, topic_defaults: Mapping[str, str]) -> str:
    topic_name = name if resource_type == TOPIC_RESOURCE else DYNAMIC_BROKER_CONFIGS[name]
    definition = TOPIC_CONFIGS[topic_name]
    if topic_name in topic_defaults:
        return topic_defaults[topic_name]
    if definition.default is not None:
        return definition.default
    # The configs with effect have their default in LogConfig (cleanup.policy: delete).
    return LogConfig().to_configs().get(topic_name, "")


def apply_alterations(current: Mapping[str, str], req: pb.ConfigResourceAlteration,
                      incremental: bool, topic_defaults: Mapping[str, str]) -> dict[str, str]:
    """The resource's new own configs, or a typed error (nothing changed)."""
    alterations = list(req.alterations)
    if len(alterations) > ALTERATIONS_PER_RESOURCE_MAX:
        raise InvalidRequestError(f"more than {ALTERATIONS_PER_RESOURCE_MAX} configs")
    if not incremental:
        return {a.name: a.value for a in alterations if not a.value_null}
    repeated = [n for n, times in Counter(a.name for a in alterations).items() if times > 1]
    if repeated:
        raise InvalidRequestError(f"Error due to duplicate config keys: {', '.join(repeated)}")
    configs = dict(current)
    for a in alterations:
        if a.operation not in OPERATION_NAMES:
            raise InvalidRequestError(f"unknown config operation {a.operation} for {a.name}")
        if a.operation == DELETE:
            configs.pop(a.name, None)
            continue
        if a.value_null:
            raise InvalidRequestError(
                f"Null value not supported for: {a.name} ({OPERATION_NAMES[a.operation]})")
        if a.operation == SET:
            configs[a.name] = a.value
            continue
        known = (a.name in TOPIC_CONFIGS if req.resource_type == TOPIC_RESOURCE
                 else a.name in DYNAMIC_BROKER_CONFIGS)
        if not known or not _is_list(req.resource_type, a.name):
            raise InvalidConfigError(f"Config value {OPERATION_NAMES[a.operation].lower()} is "
                                     f"not allowed for config key: {a.name}")
        old = configs.get(a.name, _list_default(req.resource_type, a.name, topic_defaults))
        items = [item.strip() for item in old.split(",") if item.strip()]
        given = [item.strip() for item in a.value.split(",") if item.strip()]
        if a.operation == APPEND:
            items += [item for item in given if item not in items]
        else:
            items = [item for item in items if item not in given]
        configs[a.name] = ",".join(items)
    return configs


def _check_broker_configs(configs: Mapping[str, str]) -> None:
    read_only = sorted(name for name in configs if not is_dynamic_broker_config(name))
    if read_only:
        raise InvalidRequestError(
            f"Cannot update these configs dynamically: {', '.join(read_only)}")
    for name, value in configs.items():
        validate_dynamic_broker_config(name, value)


def alter_configs(metadata: ClusterMetadata, req: pb.AlterConfigsRequest,
                  append: Callable[[MetadataRecord], Any],
                  topic_defaults: Mapping[str, str]) -> pb.AlterConfigsResponse:
    """Kafka's (Incremental)AlterConfigs. ``append`` takes each record (``Tx.append``);
    ``topic_defaults``: the controller's defaults a new topic would get."""
    response = pb.AlterConfigsResponse()
    keys = Counter((r.resource_type, r.resource_name) for r in req.resources)
    for r in req.resources:
        result = response.results.add(resource_type=r.resource_type,
                                      resource_name=r.resource_name, error_code=pb.NONE)
        try:
            if len(req.resources) > RESOURCES_PER_REQUEST_MAX:
                raise InvalidRequestError(f"more than {RESOURCES_PER_REQUEST_MAX} resources")
            if keys[(r.resource_type, r.resource_name)] > 1:
                raise InvalidRequestError(
                    f"resource {r.resource_name!r} (type {r.resource_type}) is named twice")
            new = _altered(metadata, r, req.incremental, topic_defaults)
        except TidewaterError as e:
            result.error_code, result.error_message = e.error_code, str(e)
            continue
        if not req.validate_only and new != _own_configs(metadata, r):
            append(configs_altered_record(r.resource_type, r.resource_name, new))
    return response


def _own_configs(metadata: ClusterMetadata, r: pb.ConfigResourceAlteration) -> dict[str, str]:
    if r.resource_type == TOPIC_RESOURCE:
        return dict(metadata.topics[r.resource_name].configs)
    return dict(metadata.broker_configs.get(r.resource_name, {}))


def _altered(metadata: ClusterMetadata, r: pb.ConfigResourceAlteration, incremental: bool,
             topic_defaults: Mapping[str, str]) -> dict[str, str]:
    if r.resource_type == TOPIC_RESOURCE:
        if r.resource_name not in metadata.topics:
            raise UnknownTopicOrPartitionError(f"topic {r.resource_name!r} does not exist")
        new = apply_alterations(_own_configs(metadata, r), r, incremental, topic_defaults)
        validate_topic_configs(new)
        return new
    if r.resource_type == BROKER_RESOURCE:
        name = r.resource_name
        if name != CLUSTER_DEFAULT and not (name.isdigit() and int(name) in metadata.brokers):
            raise InvalidRequestError(f"broker {name!r} is not a registered broker id "
                                      "(or \"\" for the cluster-wide default)")
        new = apply_alterations(_own_configs(metadata, r), r, incremental, topic_defaults)
        _check_broker_configs(new)
        return new
    raise InvalidRequestError(f"resource type {r.resource_type}: only topics (2) and "
                              "brokers (4) can be altered")
