"""Kafka message schemas the ``kio`` package lacks, in its generated form.

``codec.py`` looks here before kio (``EXTRA_SCHEMAS``): (api key, version) ->
(request module, response module), by name: a schema module is imported at its first
request, not with the broker (issue 30, restart time; as kio's own are).
"""

from __future__ import annotations

EXTRA_SCHEMAS: dict[tuple[int, int], tuple[str, str]] = {
    (27, 0): ("tidewater.broker.kafka.schemas.write_txn_markers_v0_request",
              "tidewater.broker.kafka.schemas.write_txn_markers_v0_response"),
}
