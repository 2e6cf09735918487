"""The quorum shell's own typed errors, in a module of their own so that the shell and
the pieces it is made of (``commit_waiters``) raise the same classes without importing
each other."""

from __future__ import annotations

from tidewater.proto import tidewater_pb2 as pb
from tidewater.proto.errors import TidewaterError


class QuorumNotCaughtUpError(TidewaterError):
    """The leader cannot take this now: too many uncommitted entries (no majority keeps
    up), a voter change still uncommitted, the voter to add behind, or too many
    proposals already waiting to commit. Retriable."""

    error_code = pb.NOT_ENOUGH_REPLICAS
    retriable = True


class QuorumStoppedError(TidewaterError):
    """The node stopped (shutdown, or after a failed write): ask another controller."""

    error_code = pb.NOT_CONTROLLER
    retriable = True
