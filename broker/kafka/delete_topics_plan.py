"""DeleteTopics' request sorted out before it is forwarded: topics named by name or, from
v6 (KIP-516), by ID; which go to the controller and which are answered at once.

Kafka's ``ControllerApis.deleteTopics`` rules, entry by entry:

- neither a name nor an ID: INVALID_REQUEST "Neither topic name nor id were specified.";
- both a name and an ID: INVALID_REQUEST "You may not specify both topic name and
  topic id.";
- a name (or an ID) given twice: one INVALID_REQUEST "Duplicate topic name." ("...id.")
  for it, and it is not deleted;
- an ID no topic has (in this broker's metadata): UNKNOWN_TOPIC_ID, no name;
- an ID whose topic the principal may not DELETE: TOPIC_AUTHORIZATION_FAILED, naming
  the topic only when the principal may DESCRIBE it (an ID reveals nothing else);
- a name the principal may not DELETE: TOPIC_AUTHORIZATION_FAILED;
- a name whose topic was also given by its ID: INVALID_REQUEST "The provided topic name
  maps to an ID that was already supplied." (once, for both).

What is left goes to the controller by name, with the ID each ID-named topic was given
by (``DeleteTopicsRequest.topic_ids``): the controller deletes such a topic only while
its name still has that ID. A topic's ID never changes nor passes to another topic, so
the name resolved here is the one the ACLs are checked against.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from tidewater.proto import tidewater_pb2 as pb

NO_TOPIC_ID = uuid.UUID(int=0)


@dataclass
class DeleteTopicsPlan:
    names: list[str] = field(default_factory=list)  # forwarded, in request order
    topic_ids: dict[str, bytes] = field(default_factory=dict)  # name -> the ID it was named by
    answered: list[dict[str, Any]] = field(default_factory=list)  # results decided here


def _result(name: str | None, topic_id: uuid.UUID, error_code: int,
            message: str | None) -> dict[str, Any]:
    return {"name": name, "topic_id": topic_id, "error_code": error_code,
            "error_message": message}


def _once(seen: dict[Any, None], twice: dict[Any, None], key: object) -> None:
    """Count ``key`` in: ``seen`` the first time, moved to ``twice`` the second."""
    if key in twice:
        return
    if key in seen:
        del seen[key]
        twice[key] = None
    else:
        seen[key] = None


def plan_delete_topics(entries: Iterable[tuple[str | None, uuid.UUID]],
                       names_by_id: Mapping[bytes, str],
                       may_delete: Callable[[str], bool],
                       may_describe: Callable[[str], bool]) -> DeleteTopicsPlan:
    """``entries``: (name or None, ID or the zero UUID) per requested topic (v1-5: names
    only); ``names_by_id``: the broker's metadata."""
    names: dict[str, None] = {}
    ids: dict[uuid.UUID, None] = {}
    twice_names: dict[str, None] = {}
    twice_ids: dict[uuid.UUID, None] = {}
    plan = DeleteTopicsPlan()
    for name, topic_id in entries:
        if name is None and topic_id == NO_TOPIC_ID:
            plan.answered.append(_result(None, NO_TOPIC_ID, pb.INVALID_REQUEST,
                                         "Neither topic name nor id were specified."))
        elif name is not None and topic_id != NO_TOPIC_ID:
            plan.answered.append(_result(name, topic_id, pb.INVALID_REQUEST,
                                         "You may not specify both topic name and topic id."))
        elif name is not None:
            _once(names, twice_names, name)
        else:
            _once(ids, twice_ids, topic_id)
    plan.answered += [_result(n, NO_TOPIC_ID, pb.INVALID_REQUEST, "Duplicate topic name.")
                      for n in twice_names]
    plan.answered += [_result(None, i, pb.INVALID_REQUEST, "Duplicate topic id.")
                      for i in twice_ids]

    by_id: dict[str, uuid.UUID] = {}  # resolved, deletable: name -> ID
    for topic_id in ids:
        resolved = names_by_id.get(topic_id.bytes)
        if resolved is None:
            plan.answered.append(_result(None, topic_id, pb.UNKNOWN_TOPIC_ID,
                                         "This server does not host this topic ID."))
        elif not may_delete(resolved):
            plan.answered.append(_result(resolved if may_describe(resolved) else None, topic_id,
                                         pb.TOPIC_AUTHORIZATION_FAILED, None))
        else:
            by_id[resolved] = topic_id
    ids_by_name = {name: uuid.UUID(bytes=raw) for raw, name in names_by_id.items()
                   if len(raw) == 16}
    for name in names:
        if not may_delete(name):
            plan.answered.append(_result(name, NO_TOPIC_ID, pb.TOPIC_AUTHORIZATION_FAILED,
                                         f"needs DELETE on topic {name!r}"))
        elif name in by_id:
            topic_id = by_id.pop(name)
            plan.answered.append(_result(
                name, topic_id, pb.INVALID_REQUEST,
                "The provided topic name maps to an ID that was already supplied."))
        elif ids_by_name.get(name) in twice_ids:
            plan.answered.append(_result(
                name, ids_by_name[name], pb.INVALID_REQUEST,
                "The provided topic name maps to an ID that was already supplied."))
        else:
            plan.names.append(name)
    for name, topic_id in by_id.items():
        plan.names.append(name)
        plan.topic_ids[name] = topic_id.bytes
    return plan
