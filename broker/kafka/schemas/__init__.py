"""Kafka message schemas the ``kio`` package lacks, in its generated form.

``codec.py`` looks here before kio (``EXTRA_SCHEMAS``): (api key, version) ->
(request module, response module).
"""

from __future__ import annotations

from types import ModuleType

from tidewater.broker.kafka.schemas import (
    write_txn_markers_v0_request,
    write_txn_markers_v0_response,
)

EXTRA_SCHEMAS: dict[tuple[int, int], tuple[ModuleType, ModuleType]] = {
    (27, 0): (write_txn_markers_v0_request, write_txn_markers_v0_response),
}
