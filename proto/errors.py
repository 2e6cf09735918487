"""Typed exceptions inside Tidewater, and their one mapping to the wire's ErrorCode.

Every exception that can reach a client carries the ``ErrorCode`` it becomes at
the gRPC boundary and whether a client should retry (``retriable``) and
refresh its metadata first (``invalid_metadata``), as aiokafka's errors do.
"""

from __future__ import annotations

from typing import cast

from tidewater.proto import tidewater_pb2 as pb

ErrorCode = pb.ErrorCode


class TidewaterError(Exception):
    """Base of every error with a wire code."""

    error_code: pb.ErrorCode = pb.UNKNOWN_SERVER_ERROR
    retriable: bool = False
    invalid_metadata: bool = False

    @property
    def error_name(self) -> str:
        return ErrorCode.Name(self.error_code)


class InvariantViolation(AssertionError):
    """A broken invariant: a bug, never a client's fault. Not a TidewaterError, so no
    mapping turns it into an ErrorCode: every catch-all lets it through to the process's
    ``TaskSupervisor.fail`` (``proto/supervisor.py``), and the broker or controller stops
    with a clear line. Raised where an ``assert`` would be, and kept under ``python -O``."""


class CorruptRecordError(TidewaterError):
    """A batch failed framing, magic or CRC checks.

    ``position`` is the byte position of the bad batch in the buffer or file it
    was read from; ``path`` is set when it came from a file.
    """

    error_code = pb.CORRUPT_MESSAGE

    def __init__(self, message: str, *, position: int = -1, path: str | None = None,
                 too_large: bool = False):
        self.position = position
        self.path = path
        self.too_large = too_large
        where = f" at {path}:{position}" if path else (f" at position {position}" if position >= 0 else "")
        super().__init__(message + where)
        self.reason = message


class MessageTooLargeError(TidewaterError):
    error_code = pb.MESSAGE_TOO_LARGE


class RecordListTooLargeError(TidewaterError):
    error_code = pb.RECORD_LIST_TOO_LARGE


class InvalidTopicError(TidewaterError):
    error_code = pb.INVALID_TOPIC_EXCEPTION


class UnknownTopicOrPartitionError(TidewaterError):
    error_code = pb.UNKNOWN_TOPIC_OR_PARTITION
    retriable = True
    invalid_metadata = True


class NotLeaderOrFollowerError(TidewaterError):
    error_code = pb.NOT_LEADER_OR_FOLLOWER
    retriable = True
    invalid_metadata = True


class LeaderNotAvailableError(TidewaterError):
    error_code = pb.LEADER_NOT_AVAILABLE
    retriable = True
    invalid_metadata = True


class BrokerNotAvailableError(TidewaterError):
    """This broker cannot take the request yet (e.g. a controller request before the broker
    registered): the sender retries later."""

    error_code = pb.BROKER_NOT_AVAILABLE
    retriable = True


class OffsetOutOfRangeError(TidewaterError):
    error_code = pb.OFFSET_OUT_OF_RANGE


class FencedLeaderEpochError(TidewaterError):
    error_code = pb.FENCED_LEADER_EPOCH
    retriable = True
    invalid_metadata = True


class UnknownLeaderEpochError(TidewaterError):
    error_code = pb.UNKNOWN_LEADER_EPOCH
    retriable = True


class NotEnoughReplicasError(TidewaterError):
    error_code = pb.NOT_ENOUGH_REPLICAS
    retriable = True


class NotEnoughReplicasAfterAppendError(TidewaterError):
    error_code = pb.NOT_ENOUGH_REPLICAS_AFTER_APPEND
    retriable = True


class InvalidRequiredAcksError(TidewaterError):
    error_code = pb.INVALID_REQUIRED_ACKS


class RequestTimedOutError(TidewaterError):
    error_code = pb.REQUEST_TIMED_OUT
    retriable = True


class NotControllerError(TidewaterError):
    """This controller does not lead the quorum: retry on the leader it names, if any."""

    error_code = pb.NOT_CONTROLLER
    retriable = True
    invalid_metadata = True


class InvalidRequestError(TidewaterError):
    error_code = pb.INVALID_REQUEST


class InvalidConfigError(TidewaterError):
    error_code = pb.INVALID_CONFIG


class PolicyViolationError(TidewaterError):
    """The topic's policy forbids it (DeleteRecords on a compacted-only topic)."""

    error_code = pb.POLICY_VIOLATION


class InvalidRecordError(TidewaterError):
    """A well-formed record the log may not take (Kafka's InvalidRecordException): a
    record without a key in a compacted topic. Not retriable. ``record_errors``: (index
    in its batch, message) of each record refused, as Kafka's RecordValidationException
    (empty when the refusal is the batch's, not a record's)."""

    error_code = pb.INVALID_RECORD

    def __init__(self, message: str, record_errors: tuple[tuple[int, str], ...] = ()):
        super().__init__(message)
        self.record_errors = record_errors


class InvalidTimestampError(TidewaterError):
    """A record's CreateTime lies outside the topic's KIP-937 bounds
    (``message.timestamp.before.max.ms`` / ``after.max.ms``). Not retriable."""

    error_code = pb.INVALID_TIMESTAMP


class UnsupportedVersionError(TidewaterError):
    """The peer does not implement the RPC (gRPC UNIMPLEMENTED): it is not a Tidewater
    process of this release, or not the service asked for. Retrying cannot help."""

    error_code = pb.UNSUPPORTED_VERSION


class UnsupportedCompressionError(TidewaterError):
    error_code = pb.UNSUPPORTED_COMPRESSION_TYPE


class UnknownTopicIdError(TidewaterError):
    """The topic ID is not one this broker knows (deleted, or not created yet here)."""

    error_code = pb.UNKNOWN_TOPIC_ID
    retriable = True
    invalid_metadata = True


class FetchSessionIdNotFoundError(TidewaterError):
    """The session is not in this broker's cache (evicted, closed, broker restarted)."""

    error_code = pb.FETCH_SESSION_ID_NOT_FOUND
    retriable = True


class InvalidFetchSessionEpochError(TidewaterError):
    """The request's epoch is not the session's next (a lost or repeated request)."""

    error_code = pb.INVALID_FETCH_SESSION_EPOCH
    retriable = True


class FetchSessionTopicIdError(TidewaterError):
    """A session opened with topic names used with topic ids (v13+), or the other way."""

    error_code = pb.FETCH_SESSION_TOPIC_ID_ERROR
    retriable = True


class InconsistentTopicIdError(TidewaterError):
    """The topic ID given differs from the one of the log or topic it names."""

    error_code = pb.INCONSISTENT_TOPIC_ID
    retriable = True
    invalid_metadata = True


class InconsistentClusterIdError(TidewaterError):
    """The controller's cluster ID differs from the one this broker's data dir belongs to."""

    error_code = pb.INCONSISTENT_CLUSTER_ID


class StaleControllerEpochError(TidewaterError):
    error_code = pb.STALE_CONTROLLER_EPOCH


class StaleBrokerEpochError(TidewaterError):
    error_code = pb.STALE_BROKER_EPOCH


class ClusterAuthorizationFailedError(TidewaterError):
    """A request only a cluster member may send (a controller's LeaderAndIsr, a follower's
    fetch, a broker's heartbeat) came without that member's credentials."""

    error_code = pb.CLUSTER_AUTHORIZATION_FAILED


class DuplicateBrokerRegistrationError(TidewaterError):
    """Another live process is registered with this broker's ID (Kafka's
    DUPLICATE_BROKER_REGISTRATION): this one must not serve as that broker."""

    error_code = pb.DUPLICATE_BROKER_REGISTRATION


class KafkaStorageError(TidewaterError):
    """A log dir failed (full disk, permission, I/O). Data already written stays intact."""

    error_code = pb.KAFKA_STORAGE_ERROR
    retriable = True
    invalid_metadata = True

    def __init__(self, message: str, *, path: str | None = None):
        self.path = path
        super().__init__(f"{message} ({path})" if path else message)


class OutOfOrderSequenceError(TidewaterError):
    """A produce batch's first sequence does not follow its producer's last one (a gap,
    or a repeat older than the five batches remembered): not retriable as is (the
    producer bumps its epoch and numbers from 0 again)."""

    error_code = pb.OUT_OF_ORDER_SEQUENCE_NUMBER


class InvalidProducerEpochError(TidewaterError):
    """A produce batch carries an epoch older than its producer's latest."""

    error_code = pb.INVALID_PRODUCER_EPOCH


class InvalidTxnStateError(TidewaterError):
    """A request or batch that does not fit the transaction's state (EndTxn with nothing
    open; a plain batch while the producer's transaction is open)."""

    error_code = pb.INVALID_TXN_STATE


class TransactionCoordinatorFencedError(TidewaterError):
    """A marker from a transaction coordinator older than one that already wrote for the
    producer: a newer coordinator owns the transaction now."""

    error_code = pb.TRANSACTION_COORDINATOR_FENCED


class UnknownProducerIdError(TidewaterError):
    """The partition has no state for the batch's producer and the batch does not start
    its sequence at 0 (its earlier batches expired or were deleted)."""

    error_code = pb.UNKNOWN_PRODUCER_ID


class CoordinatorLoadInProgressError(TidewaterError):
    """No producer id to give yet (the controller has not answered for a block)."""

    error_code = pb.COORDINATOR_LOAD_IN_PROGRESS
    retriable = True


class UnstableOffsetCommitError(TidewaterError):
    """OffsetFetch with require_stable (KIP-447): a transaction holds an offset of the
    partition pending until its marker; the consumer asks again after a back-off."""

    error_code = pb.UNSTABLE_OFFSET_COMMIT
    retriable = True


class ConcurrentTransactionsError(TidewaterError):
    """The transactional id has a state change in flight (a write, or markers being
    written): the producer retries after a back-off."""

    error_code = pb.CONCURRENT_TRANSACTIONS
    retriable = True


class ProducerFencedError(TidewaterError):
    """A newer producer with the same transactional id (or the coordinator, at a
    timeout) bumped the epoch: this producer is a zombie and must close."""

    error_code = pb.PRODUCER_FENCED


class InvalidProducerIdMappingError(TidewaterError):
    """The producer id is not the one the coordinator holds for the transactional id."""

    error_code = pb.INVALID_PRODUCER_ID_MAPPING


class InvalidTransactionTimeoutError(TidewaterError):
    """transaction.timeout.ms is not above 0 or exceeds transaction.max.timeout.ms."""

    error_code = pb.INVALID_TRANSACTION_TIMEOUT


class TopicAlreadyExistsError(TidewaterError):
    error_code = pb.TOPIC_ALREADY_EXISTS


class InvalidReplicaAssignmentError(TidewaterError):
    """A manual replica assignment Kafka's rules refuse (unknown broker, a broker twice,
    partitions of different replica counts)."""

    error_code = pb.INVALID_REPLICA_ASSIGNMENT


class NoReassignmentInProgressError(TidewaterError):
    """AlterPartitionReassignments cancel: the partition has no ongoing reassignment."""

    error_code = pb.NO_REASSIGNMENT_IN_PROGRESS


class ElectionNotNeededError(TidewaterError):
    """ElectLeaders: the partition already has the leader the election would give it."""

    error_code = pb.ELECTION_NOT_NEEDED


class PreferredLeaderNotAvailableError(TidewaterError):
    """ElectLeaders (preferred): the first replica is not live or not in the ISR."""

    error_code = pb.PREFERRED_LEADER_NOT_AVAILABLE
    retriable = True


class EligibleLeadersNotAvailableError(TidewaterError):
    """ElectLeaders (unclean): no replica is live."""

    error_code = pb.ELIGIBLE_LEADERS_NOT_AVAILABLE
    retriable = True


class CorruptFileError(TidewaterError):
    """A checkpoint or index file on disk is malformed."""

    error_code = pb.KAFKA_STORAGE_ERROR

    def __init__(self, message: str, *, path: str | None = None, line: int | None = None):
        self.path = path
        self.line = line
        where = f"{path}" + (f":{line}" if line is not None else "") if path else ""
        super().__init__(f"{message}: {where}" if where else message)


_BY_CODE: dict[int, type[TidewaterError]] = {}
for _cls in list(globals().values()):
    if isinstance(_cls, type) and issubclass(_cls, TidewaterError) and _cls is not TidewaterError:
        _BY_CODE.setdefault(_cls.error_code, _cls)


def code_name(code: int) -> str:
    """The ErrorCode's name, or the number for a Kafka code our enum does not list."""
    try:
        return ErrorCode.Name(code)
    except ValueError:
        return str(code)


def error_for_code(code: int, message: str = "") -> TidewaterError:
    """The typed exception a client raises for a wire code (not for NONE)."""
    cls = _BY_CODE.get(code)
    if cls is None or cls in (CorruptRecordError, KafkaStorageError, CorruptFileError):
        name = ErrorCode.Name(code) if code in ErrorCode.values() else f"error {code}"
        err = TidewaterError(message or name)
        err.error_code = cast(ErrorCode, code)  # a wire code, possibly not in our enum
        if cls is not None:
            err.retriable = cls.retriable
            err.invalid_metadata = cls.invalid_metadata
        return err
    return cls(message or ErrorCode.Name(code))


def is_retriable(code: int) -> bool:
    cls = _BY_CODE.get(code)
    return bool(cls and cls.retriable) or code in (
        pb.LEADER_NOT_AVAILABLE, pb.REQUEST_TIMED_OUT, pb.NETWORK_EXCEPTION,
        pb.BROKER_NOT_AVAILABLE, pb.REPLICA_NOT_AVAILABLE, pb.OFFSET_NOT_AVAILABLE,
    )
