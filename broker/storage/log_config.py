"""Per-log configuration: ``LogConfig`` and Kafka's topic config names.

The parser lives in ``tidewater.proto.topic_config``, shared with the
controller (which checks a topic's configs with it at CreateTopics), so a
topic the controller accepts is one every broker can host. Re-exported here
for the storage code.
"""

from tidewater.proto.topic_config import (
    DAY_MS,
    GIB,
    INDEX_ENTRY_BYTES_MAX,
    INT32_MAX,
    INT64_MAX,
    LOG_CONFIG_NAMES,
    MIB,
    SEGMENT_BYTES_MIN,
    TIMESTAMP_TYPES,
    LogConfig,
)

__all__ = ["DAY_MS", "GIB", "INDEX_ENTRY_BYTES_MAX", "INT32_MAX", "INT64_MAX", "LOG_CONFIG_NAMES",
           "MIB", "SEGMENT_BYTES_MIN", "TIMESTAMP_TYPES", "LogConfig"]
