"""``tide quorum``: kafka-metadata-quorum.sh for a controller quorum (issue 26).

``format`` is kafka-storage format for a controller's directory (``quorum.formatting``):
once, before its first start; ``--no-initial-controllers`` for a controller to add (new,
or wiped: it then runs as an observer with a new directory id).
``describe --status`` / ``describe --replication`` print what Kafka's tool prints, from
the quorum leader's DescribeQuorum; ``add-controller`` / ``remove-controller`` change
the voter set (KIP-853) over ChangeQuorumVoters. ``--bootstrap-controller`` lists the
controllers' quorum endpoints (``controller.quorum.voters``' HOST:PORTs); the leader is
found among them. ``describe`` without it goes through a broker (``--bootstrap-server``):
the Controller service's DescribeQuorum, forwarded to the active controller. Timestamps are epoch milliseconds: the leader reports ages, which are
taken from this machine's clock.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import TYPE_CHECKING

import grpc

from tidewater.client.admin import AdminClient
from tidewater.controller.quorum.admin import (
    VoterChange,
    change_voters,
    describe_leader,
    parse_controllers,
)
from tidewater.controller.quorum.config import parse_initial_controllers
from tidewater.controller.quorum.format_controller import (
    MigrationNeedsVotersError,
    format_controller,
)
from tidewater.controller.quorum.formatting import raft_directory
from tidewater.proto import tidewater_pb2 as pb
from tidewater.proto.errors import InvalidConfigError, InvalidRequestError, TidewaterError
from tidewater.tools.cli import CliError
from tidewater.tools.commands._common import (
    add_bootstrap_argument,
    bootstrap_of,
    describe_error,
    security_of,
)

if TYPE_CHECKING:
    from tidewater.tools.cli import Subparsers

DIRECTORY_ID_HEX_DIGITS = 32


def register(subparsers: Subparsers) -> None:
    parser = subparsers.add_parser(
        "quorum", help="the controller quorum (kafka-metadata-quorum.sh): describe, "
                       "add-controller, remove-controller; format (kafka-storage format)")
    sub = parser.add_subparsers(dest="quorum_command", metavar="ACTION")
    sub.required = True
    describe = sub.add_parser("describe", help="the quorum's leader, voters and their lag")
    shown = describe.add_mutually_exclusive_group(required=True)
    shown.add_argument("--status", action="store_true",
                       help="leader, epoch, high watermark, follower lag, voters, observers")
    shown.add_argument("--replication", action="store_true",
                       help="each voter's and observer's log end offset, lag and fetch times")
    describe.add_argument("--bootstrap-controller", metavar="HOST:PORT[,...]",
                          help="controllers' quorum endpoints (controller.quorum.voters); "
                               "without it, through a broker (--bootstrap-server)")
    add_bootstrap_argument(describe)
    describe.set_defaults(func=run_describe)
    for name, adding in (("add-controller", True), ("remove-controller", False)):
        change = sub.add_parser(
            name, help=("make a controller (running as an observer) a voter" if adding
                        else "take a voter out of the quorum"))
        add_controllers_argument(change)
        change.add_argument("--controller-id", type=int, required=True, help="its node.id")
        change.add_argument("--controller-directory-id", required=True,
                            help="its metadata log directory id (32 hex digits, as "
                                 "`tide quorum describe --replication` shows it)")
        change.add_argument("--timeout-ms", type=int, default=10_000,
                            help="how long the leader waits for the change to commit")
        change.set_defaults(func=run_change, adding=adding)
    fmt = sub.add_parser(
        "format", help="format a controller's metadata log directory once, before its first "
                       "start (kafka-storage format)")
    fmt.add_argument("--data-dir", required=True, type=Path,
                     help="the controller's --data-dir (its Raft files go in DIR/raft)")
    fmt.add_argument("--node-id", type=int, required=True, help="the controller's node.id")
    initial = fmt.add_mutually_exclusive_group(required=True)
    initial.add_argument("--initial-controllers", metavar="ID@HOST:PORT:DIRECTORY_ID,...",
                         help="a new cluster's voters (directory ids: 32 random hex digits "
                              "each); this node takes the one listed for it")
    initial.add_argument("--no-initial-controllers", action="store_true",
                         help="a new directory id and no voters: the controller runs as an "
                              "observer until add-controller makes it a voter (a new or a "
                              "wiped controller)")
    fmt.add_argument("--migrate-metadata-log", type=Path, metavar="PATH",
                     help="a single controller's metadata.log: the directory starts with it "
                          "as a snapshot (format every controller of --initial-controllers "
                          "from the same file; this controller's own log is then renamed "
                          "metadata.log.migrated)")
    fmt.set_defaults(func=run_format)


def add_controllers_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--bootstrap-controller", required=True, metavar="HOST:PORT[,...]",
                        help="controllers' quorum endpoints (controller.quorum.voters)")
    parser.add_argument("--command-config", default=argparse.SUPPRESS, metavar="FILE",
                        help="Kafka client properties: with ssl.cafile/certfile/keyfile, "
                             "mTLS to the quorum endpoints (TIDE_COMMAND_CONFIG)")


def quorum_credentials(args: argparse.Namespace) -> grpc.ChannelCredentials | None:
    """TLS for the controllers' quorum endpoints, from --command-config's ssl.* files
    (None: plaintext). SASL settings do not apply there: the quorum port authenticates
    by certificate only."""
    security = security_of(args)
    cafile = security.get("ssl_cafile")
    if not cafile:
        return None

    def read(path: str | None) -> bytes | None:
        if not path:
            return None
        try:
            with open(path, "rb") as f:
                return f.read()
        except OSError as e:
            raise CliError(f"--command-config: cannot read {path}: {e.strerror}",
                           exit_code=2) from None
    return grpc.ssl_channel_credentials(root_certificates=read(cafile),
                                        private_key=read(security.get("ssl_keyfile")),
                                        certificate_chain=read(security.get("ssl_certfile")))


def controllers_of(args: argparse.Namespace) -> list[str]:
    try:
        return parse_controllers(args.bootstrap_controller)
    except InvalidRequestError as e:
        raise CliError(f"--bootstrap-controller: {e}", exit_code=2) from None


def _call_failed(action: str, e: Exception) -> CliError:
    if isinstance(e, TidewaterError):
        return CliError(f"{action}: {describe_error(e)}")
    assert isinstance(e, grpc.RpcError)
    return CliError(f"{action}: {e.code().name}")


def run_describe(args: argparse.Namespace) -> int:
    try:
        if args.bootstrap_controller is None:
            # Through a broker: DescribeQuorum forwarded to the active controller.
            with AdminClient(bootstrap_of(args), **security_of(args)) as admin:
                described = admin.describe_metadata_quorum()
        else:
            described = describe_leader(controllers_of(args),
                                        credentials=quorum_credentials(args))
    except (TidewaterError, grpc.RpcError) as e:
        raise _call_failed("describe quorum", e) from None
    now_ms = int(time.time() * 1000)
    print(format_status(described) if args.status else format_replication(described, now_ms))
    return 0


def _timestamp(age_ms: int, now_ms: int) -> int:
    return -1 if age_ms < 0 else now_ms - age_ms


def format_status(d: pb.DescribeQuorumResponse) -> str:
    """kafka-metadata-quorum.sh describe --status."""
    leader = next(r for r in d.replicas if r.replica.id == d.leader_id)
    followers = [r for r in d.replicas if r.is_voter and r.replica.id != d.leader_id]
    # Kafka: the voter furthest behind the leader's log end, and how long since it caught up.
    lag_of = {r.replica.id: leader.log_end_offset - r.log_end_offset for r in followers}
    laggard = max(followers, key=lambda r: (lag_of[r.replica.id], r.replica.id), default=None)
    if laggard is None:
        max_lag, max_lag_ms = 0, 0
    else:
        max_lag = lag_of[laggard.replica.id]
        max_lag_ms = (-1 if laggard.last_caught_up_age_ms < 0
                      else max(0, laggard.last_caught_up_age_ms - max(leader.last_caught_up_age_ms, 0)))
    voters = [{"id": v.id, "directoryId": v.directory_id} for v in d.voters]
    observers = [{"id": r.replica.id, "directoryId": r.replica.directory_id}
                 for r in d.replicas if not r.is_voter]
    rows = [("ClusterId", d.cluster_id), ("LeaderId", d.leader_id), ("LeaderEpoch", d.epoch),
            ("HighWatermark", d.high_watermark), ("MaxFollowerLag", max_lag),
            ("MaxFollowerLagTimeMs", max_lag_ms), ("CurrentVoters", json.dumps(voters)),
            ("CurrentObservers", json.dumps(observers))]
    return "\n".join(f"{name + ':':<24}{value}" for name, value in rows)


def format_replication(d: pb.DescribeQuorumResponse, now_ms: int) -> str:
    """kafka-metadata-quorum.sh describe --replication: the leader first, then voters,
    then observers."""
    def status(r: pb.QuorumReplicaState) -> str:
        if r.replica.id == d.leader_id:
            return "Leader"
        return "Follower" if r.is_voter else "Observer"

    order = {"Leader": 0, "Follower": 1, "Observer": 2}
    replicas = sorted(d.replicas, key=lambda r: (order[status(r)], r.replica.id))
    header = ("NodeId", "DirectoryId", "LogEndOffset", "Lag", "LastFetchTimestamp",
              "LastCaughtUpTimestamp", "Status")
    rows = [header] + [
        (str(r.replica.id), r.replica.directory_id, str(r.log_end_offset), str(r.lag),
         str(_timestamp(r.last_fetch_age_ms, now_ms)),
         str(_timestamp(r.last_caught_up_age_ms, now_ms)), status(r)) for r in replicas]
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip()
                     for row in rows)


def run_change(args: argparse.Namespace) -> int:
    controllers = controllers_of(args)
    directory_id = args.controller_directory_id.strip().lower()
    if (len(directory_id) != DIRECTORY_ID_HEX_DIGITS
            or any(c not in "0123456789abcdef" for c in directory_id)):
        raise CliError("--controller-directory-id: expected 32 hex digits", exit_code=2)
    if args.controller_id < 0:
        raise CliError("--controller-id: must not be negative", exit_code=2)
    action = "add controller" if args.adding else "remove controller"
    try:
        leader = change_voters(controllers, VoterChange(args.controller_id, directory_id,
                                                        args.adding), args.timeout_ms,
                              credentials=quorum_credentials(args))
    except (TidewaterError, grpc.RpcError) as e:
        raise _call_failed(action, e) from None
    verb = "Added" if args.adding else "Removed"
    print(f"{verb} controller {args.controller_id} with directory id {directory_id} "
          f"(leader {leader})")
    return 0


def run_format(args: argparse.Namespace) -> int:
    if args.node_id < 0:
        raise CliError("--node-id: must not be negative", exit_code=2)
    try:
        voters = (None if args.no_initial_controllers
                  else parse_initial_controllers(args.initial_controllers))
    except InvalidConfigError as e:
        raise CliError(f"--initial-controllers: {e}", exit_code=2) from None
    raft_dir = raft_directory(args.data_dir)
    try:
        result = format_controller(raft_dir, args.node_id, voters,
                                   migrate_from=args.migrate_metadata_log)
    except MigrationNeedsVotersError as e:
        raise CliError(str(e), exit_code=2) from None
    except InvalidConfigError as e:
        raise CliError(f"--migrate-metadata-log: {e}", exit_code=1) from None
    except FileExistsError:
        raise CliError(f"{raft_dir} is formatted already (a directory is formatted once)",
                       exit_code=1) from None
    except OSError as e:
        raise CliError(f"cannot format {raft_dir}: {e.strerror}", exit_code=1) from None
    except TidewaterError as e:  # a running controller's locked log, a corrupt log
        raise CliError(f"cannot migrate {args.migrate_metadata_log}: {e}", exit_code=1) from None
    local = result.local
    migrated = ("" if result.snapshot is None else
                f", holding {args.migrate_metadata_log} as a snapshot up to offset "
                f"{result.snapshot.snapshot_id.offset}")
    role = ("an observer until add-controller" if voters is None or local not in voters
            else "a voter")
    print(f"Formatted {raft_dir} as controller {local.id} with directory id "
          f"{local.directory_id} ({role}){migrated}")
    return 0
