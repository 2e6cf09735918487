"""The group and transaction APIs' keys, advertised versions and names, apart from their
handlers (``group_apis``, ``txn_apis``): ApiVersions and the listener's metrics need
these at start-up, the handlers and the coordinators under them only at the first such
request (``apis.HANDLERS`` imports them then; see ``broker/coordinators.py`` for why).
"""

from __future__ import annotations

OFFSET_COMMIT, OFFSET_FETCH, FIND_COORDINATOR, JOIN_GROUP = 8, 9, 10, 11
HEARTBEAT, LEAVE_GROUP, SYNC_GROUP, DESCRIBE_GROUPS, LIST_GROUPS = 12, 13, 14, 15, 16
DELETE_GROUPS, OFFSET_DELETE = 42, 47

GROUP_VERSIONS: dict[int, tuple[int, int]] = {
    FIND_COORDINATOR: (0, 4),
    JOIN_GROUP: (0, 9),
    SYNC_GROUP: (0, 5),
    HEARTBEAT: (0, 4),
    LEAVE_GROUP: (0, 5),
    OFFSET_COMMIT: (2, 9),
    OFFSET_FETCH: (1, 8),
    DESCRIBE_GROUPS: (0, 5),
    LIST_GROUPS: (0, 5),
    DELETE_GROUPS: (0, 2),
    OFFSET_DELETE: (0, 0),
}
GROUP_API_NAMES = {FIND_COORDINATOR: "FindCoordinator", JOIN_GROUP: "JoinGroup",
                   SYNC_GROUP: "SyncGroup", HEARTBEAT: "Heartbeat", LEAVE_GROUP: "LeaveGroup",
                   OFFSET_COMMIT: "OffsetCommit", OFFSET_FETCH: "OffsetFetch",
                   DESCRIBE_GROUPS: "DescribeGroups", LIST_GROUPS: "ListGroups",
                   DELETE_GROUPS: "DeleteGroups", OFFSET_DELETE: "OffsetDelete"}

ADD_PARTITIONS_TO_TXN, ADD_OFFSETS_TO_TXN, END_TXN, TXN_OFFSET_COMMIT = 24, 25, 26, 28
DESCRIBE_TRANSACTIONS, LIST_TRANSACTIONS = 65, 66

TXN_VERSIONS: dict[int, tuple[int, int]] = {
    ADD_PARTITIONS_TO_TXN: (0, 5),
    ADD_OFFSETS_TO_TXN: (0, 3),
    END_TXN: (0, 4),
    DESCRIBE_TRANSACTIONS: (0, 0),
    LIST_TRANSACTIONS: (0, 1),
    TXN_OFFSET_COMMIT: (0, 3),
}
