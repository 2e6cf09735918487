"""``python -m tidewater.controller.quorum``: a controller quorum node, and its admin.

Commands::

    format   --node-id N --data-dir D (--initial-controllers 1@H:P:DIRID,... [--new-directory-id]
                                       [--migrate-metadata-log PATH]
                                       | --no-initial-controllers)
    run      --node-id N --data-dir D --voters 1@H:P,2@H:P,... [--observers ...]
             [--max-connections N] [--connections-max-idle-ms MS]
    propose  --bootstrap H:P RECORD...        (prints first offset and epoch)
    read     --bootstrap H:P [--start-offset O] (prints offset, epoch, record per line)
    describe --bootstrap H:P                  (JSON: leader, epoch, high watermark, replicas)

``format`` is Kafka's ``kafka-storage format`` (``format_controller``: migrate or
format empty, over ``formatting``, the one implementation):
the node takes the directory id ``--initial-controllers`` gives it (the bootstrap
voter set), or with ``--new-directory-id`` a new one; ``--no-initial-controllers``
formats with a new directory id and no voter set (a wiped voter's replacement, or a
node to be added: it runs as an observer until ``ChangeQuorumVoters`` adds it). ``run``
refuses a directory never formatted. ``run``
prints ``quorum node listening on port P`` once it serves.

``--tls-ca``/``--tls-cert``/``--tls-key`` (or ``TIDE_TLS_*``), the controller's TLS
options: ``run`` serves the Raft port with mTLS only (peers and admin tools present
certificates of the CA; Raft messages, propose and read only from a controller
certificate) and sends to its peers with its certificate; the admin commands connect
with them.

Exit codes of ``run``: 0 after SIGTERM/SIGINT; 1 when a fatal error stopped it;
2 on bad arguments; 3 (``EXIT_RAFT_NOT_DURABLE``) when a Raft write failed (full
disk, I/O error): nothing that write held was sent or applied, and restarting
recovers from what is on disk. Admin commands exit 1 with the error's code name.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import signal
import sys
from pathlib import Path

from tidewater.proto import grpc_env

grpc_env.apply()

import grpc  # noqa: E402  (after grpc_env.apply)
import uvloop  # noqa: E402

from tidewater.broker.servicers.grpc_limits import (  # noqa: E402
    CONNECTIONS_MAX_IDLE_MS,
    CONTROLLER_MAX_CONNECTIONS,
)
from tidewater.controller.quorum.admin import describe_json, describe_one  # noqa: E402
from tidewater.controller.quorum.config import (  # noqa: E402
    QuorumConfig,
    parse_endpoints,
    parse_initial_controllers,
)
from tidewater.controller.quorum.format_controller import format_controller  # noqa: E402
from tidewater.controller.quorum.formatting import require_formatted  # noqa: E402
from tidewater.controller.quorum.shell import QuorumShell  # noqa: E402
from tidewater.controller.raft import RaftConfig  # noqa: E402
from tidewater.proto import tidewater_pb2 as pb  # noqa: E402
from tidewater.proto import tidewater_pb2_grpc as pb_grpc  # noqa: E402
from tidewater.proto.errors import InvalidConfigError, KafkaStorageError, TidewaterError  # noqa: E402
from tidewater.proto.tls import (  # noqa: E402
    TlsFiles,
    TlsMaterial,
    add_tls_arguments,
    channel_credentials,
)

log = logging.getLogger("tidewater.controller.quorum")

EXIT_FATAL = 1
EXIT_USAGE = 2
EXIT_RAFT_NOT_DURABLE = 3


def exit_code_for(failure: BaseException | None) -> int:
    if failure is None:
        return 0
    if isinstance(failure, KafkaStorageError):
        return EXIT_RAFT_NOT_DURABLE
    return EXIT_FATAL


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m tidewater.controller.quorum",
                                     description="A controller quorum node (KRaft semantics)")
    commands = parser.add_subparsers(dest="command", required=True)

    fmt = commands.add_parser("format", help="create an empty Raft data directory")
    fmt.add_argument("--node-id", type=int, required=True)
    fmt.add_argument("--data-dir", type=Path, required=True)
    initial = fmt.add_mutually_exclusive_group(required=True)
    initial.add_argument("--initial-controllers",
                         help="ID@HOST:PORT:DIRECTORY_ID,...: the bootstrap voters")
    initial.add_argument("--no-initial-controllers", action="store_true",
                         help="no voter set: an observer until add-controller adds it")
    fmt.add_argument("--new-directory-id", action="store_true",
                     help="take a new directory id, not the one the list names for this node")
    fmt.add_argument("--migrate-metadata-log", type=Path, metavar="PATH",
                     help="a single controller's metadata.log, written as the directory's "
                          "first snapshot (``migration``); needs --initial-controllers")

    run = commands.add_parser("run", help="serve as a quorum node")
    run.add_argument("--node-id", type=int, required=True)
    run.add_argument("--data-dir", type=Path, required=True)
    run.add_argument("--voters", required=True, help="controller.quorum.voters: ID@HOST:PORT,...")
    run.add_argument("--observers", default="", help="other controllers: ID@HOST:PORT,...")
    run.add_argument("--fetch-timeout-ms", type=int, default=RaftConfig.fetch_timeout_ms)
    run.add_argument("--election-timeout-ms", type=int, default=RaftConfig.election_timeout_ms)
    run.add_argument("--snapshot-interval-entries", type=int, default=1000)
    run.add_argument("--max-connections", type=int, default=CONTROLLER_MAX_CONNECTIONS,
                     help="max.connections: the Raft port's connections at most")
    run.add_argument("--connections-max-idle-ms", type=int, default=CONNECTIONS_MAX_IDLE_MS,
                     help="connections.max.idle.ms: a connection with no call open this "
                          "long is closed")
    run.add_argument("--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"])
    # The controller's own TLS options: the Raft port then speaks mTLS only and admits
    # controller certificates of the CA to RaftMessages (``transport``, ``service``).
    add_tls_arguments(run)

    for name in ("propose", "read", "describe"):
        admin = commands.add_parser(name)
        admin.add_argument("--bootstrap", required=True, help="HOST:PORT of a quorum node")
        if name == "propose":
            admin.add_argument("records", nargs="+")
            admin.add_argument("--timeout-ms", type=int, default=0)
        if name == "read":
            admin.add_argument("--start-offset", type=int, default=0)
        # mTLS to a node run with --tls-*: a controller certificate for propose and read.
        add_tls_arguments(admin)
    return parser


def format_directory(args: argparse.Namespace) -> int:
    voters = (None if args.no_initial_controllers
              else parse_initial_controllers(args.initial_controllers))
    local = format_controller(args.data_dir, args.node_id, voters,
                              migrate_from=args.migrate_metadata_log,
                              fresh_directory_id=args.new_directory_id).local
    print(f"formatted {args.data_dir} as {local.id}:{local.directory_id}", flush=True)
    return 0


async def serve(config: QuorumConfig) -> int:
    stop_requested = asyncio.Event()
    shell = QuorumShell(config, on_fatal=lambda error: stop_requested.set())
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop_requested.set)
    shell.supervisor.watch_callbacks(loop)
    try:
        await shell.start()
        print(f"quorum node listening on port {shell.port}", flush=True)  # for tests
        await stop_requested.wait()
    finally:
        await shell.stop()
    if shell.failure is not None:
        print(f"quorum node {config.node_id}: stopped after a fatal error: {shell.failure!r}",
              file=sys.stderr, flush=True)
    return exit_code_for(shell.failure)


def run_node(args: argparse.Namespace) -> int:
    logging.basicConfig(level=args.log_level, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    config = QuorumConfig(
        node_id=args.node_id, data_dir=args.data_dir, voters=parse_endpoints(args.voters),
        observers=parse_endpoints(args.observers),
        raft=RaftConfig(fetch_timeout_ms=args.fetch_timeout_ms,
                        election_timeout_ms=args.election_timeout_ms),
        snapshot_interval_entries=args.snapshot_interval_entries,
        max_connections=args.max_connections,
        connections_max_idle_ms=args.connections_max_idle_ms,
        tls=tls_material(args))
    try:
        require_formatted(config.data_dir, f"python -m tidewater.controller.quorum format "
                                           f"--data-dir {config.data_dir} --node-id "
                                           f"{config.node_id}")
        return uvloop.run(serve(config))
    except (TidewaterError, OSError) as e:
        log.critical("quorum node failed: %s", e)
        return exit_code_for(e) or EXIT_FATAL


def tls_material(args: argparse.Namespace) -> TlsMaterial | None:
    """The --tls-* files, read (``TlsConfigError``, exit 2, when given in part or unreadable)."""
    files = TlsFiles.from_flags(args.tls_ca, args.tls_cert, args.tls_key,
                                need_cert=args.command == "run")
    return files.load() if files is not None else None


def admin(args: argparse.Namespace) -> int:
    tls = tls_material(args)
    with (grpc.insecure_channel(args.bootstrap) if tls is None else
          grpc.secure_channel(args.bootstrap, channel_credentials(tls))) as channel:
        stub = pb_grpc.ControllerQuorumStub(channel)
        if args.command == "propose":
            answer = stub.QuorumPropose(pb.QuorumProposeRequest(
                records=[r.encode() for r in args.records], timeout_ms=args.timeout_ms),
                timeout=70)
            if answer.error_code != pb.NONE:
                print(f"{pb.ErrorCode.Name(answer.error_code)}: {answer.error_message} "
                      f"(leader {answer.leader_id})", file=sys.stderr)
                return 1
            print(f"first offset {answer.first_offset} epoch {answer.epoch}")
        elif args.command == "read":
            read = stub.QuorumRead(pb.QuorumReadRequest(start_offset=args.start_offset),
                                   timeout=10)
            for record in read.records:
                print(f"{record.offset} {record.epoch} "
                      f"{record.data.decode('utf-8', errors='backslashreplace')}")
        else:
            print(json.dumps(describe_json(describe_one(
                args.bootstrap, credentials=channel_credentials(tls) if tls else None))))
    return 0


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        if args.command == "format":
            return format_directory(args)
        if args.command == "run":
            return run_node(args)
    except (InvalidConfigError, FileExistsError, ValueError) as e:
        print(f"quorum: {e}", file=sys.stderr)
        return EXIT_USAGE
    except KafkaStorageError as e:  # format: a running controller holds the metadata log
        print(f"quorum: {e}", file=sys.stderr)
        return EXIT_FATAL
    try:
        return admin(args)
    except InvalidConfigError as e:
        print(f"quorum: {e}", file=sys.stderr)
        return EXIT_USAGE
    except grpc.RpcError as e:
        print(f"quorum: {e}", file=sys.stderr)
        return EXIT_FATAL


if __name__ == "__main__":
    sys.exit(main())
