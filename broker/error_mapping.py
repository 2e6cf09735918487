"""The one place where exceptions become wire ErrorCodes.

Typed errors (``proto.errors``) carry their code. A batch too large for the
log is a CorruptRecordError with ``too_large`` and answers MESSAGE_TOO_LARGE.
Anything else is an unexpected failure: UNKNOWN_SERVER_ERROR, with the
traceback logged here so it is never silently lost; a broken invariant
(``InvariantViolation``) is not answered at all (``error_code_for``).
"""

from __future__ import annotations

import logging
from typing import cast

from tidewater.proto import tidewater_pb2 as pb
from tidewater.proto.errors import CorruptRecordError, InvariantViolation, TidewaterError

log = logging.getLogger("tidewater.broker")


def error_code_for(exc: BaseException, *, context: str = "") -> tuple[pb.ErrorCode, str]:
    """``(ErrorCode, message)`` to answer for ``exc``.

    An ``InvariantViolation`` is re-raised, never answered: a broken invariant is a bug
    that must stop the broker (the servicer's boundary hands it to the supervisor),
    not a request to answer UNKNOWN_SERVER_ERROR and go on from."""
    if isinstance(exc, InvariantViolation):
        raise exc
    if isinstance(exc, CorruptRecordError) and exc.too_large:
        return pb.MESSAGE_TOO_LARGE, str(exc)
    if isinstance(exc, TidewaterError):
        return exc.error_code, str(exc)
    log.error("unexpected error%s", f" in {context}" if context else "", exc_info=exc)
    return pb.UNKNOWN_SERVER_ERROR, f"{type(exc).__name__}: {exc}"


def wire_code(code: int) -> pb.ErrorCode:
    """``code`` typed as the wire's ErrorCode. The replication core (``broker/replication``)
    computes its codes from pb's constants but types them ``int``; this is where such a
    code enters a pb message (a proto3 enum field takes any number, as Kafka's do)."""
    return cast(pb.ErrorCode, code)
