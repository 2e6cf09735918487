"""The `tide` command line: Kafka-like tools for a Tidewater cluster.

Each subcommand lives in its own module exposing ``register(subparsers)``,
which adds its parser and sets ``func`` (taking the parsed args, returning an
exit code). Errors print one line to stderr and exit non-zero.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Iterable
from typing import TYPE_CHECKING, TypeAlias, TypeVar, overload

from tidewater.proto import grpc_env
from tidewater.proto.malloc_tuning import tune_malloc_for_large_buffers

# tide runs its clients as the brokers run (proto/grpc_env.py), before anything imports grpc.
grpc_env.apply()
# MiB-sized produce requests and fetch answers stay off per-call mmap (proto/malloc_tuning.py).
tune_malloc_for_large_buffers()

# Which module registers each top-level command: `tide produce` imports that module only
# (half of the CLI's start-up CPU went to importing every command's dependencies). Help,
# an unknown command or none at all import them all. A unit test checks this table
# against what the modules register.
COMMAND_MODULES = {
    "topics": "tidewater.tools.commands.topics",
    "configs": "tidewater.tools.commands.configs",
    "leader-election": "tidewater.tools.commands.configs",
    "reassign": "tidewater.tools.commands.reassign",
    "records": "tidewater.tools.commands.records",
    "log-dirs": "tidewater.tools.commands.records",
    "produce": "tidewater.tools.commands.produce",
    "consume": "tidewater.tools.commands.consume",
    "groups": "tidewater.tools.commands.groups",
    "cluster": "tidewater.tools.commands.cluster",
    "quorum": "tidewater.tools.commands.quorum",
    "certs": "tidewater.tools.commands.certs",
    "users": "tidewater.tools.commands.security",
    "acls": "tidewater.tools.commands.security",
    "quotas": "tidewater.tools.commands.quotas",
    "dump-log": "tidewater.tools.commands.dump_log",
    "metrics": "tidewater.tools.commands.metrics",
    "chaos": "tidewater.tools.commands.chaos",
    "audit": "tidewater.tools.commands.audit",
    "console": "tidewater.tools.commands.console",
}
# Modules that add subcommands, each once, in the order `tide --help` lists them; each
# has register(subparsers).
SUBCOMMAND_MODULES = list(dict.fromkeys(COMMAND_MODULES.values()))
# The top-level options that take a value (to find the command word after them).
_GLOBAL_OPTIONS_WITH_VALUE = ("--bootstrap-server", "--command-config")


if TYPE_CHECKING:
    # What a subcommand module's register(subparsers) adds its parser to.
    Subparsers: TypeAlias = argparse._SubParsersAction[argparse.ArgumentParser]


_N = TypeVar("_N")


class CliError(Exception):
    """A failure to report as one line, with the exit code to use."""

    def __init__(self, message: str, exit_code: int = 1) -> None:
        super().__init__(message)
        self.exit_code = exit_code


class SubcommandParser(argparse.ArgumentParser):
    """The parser of a subcommand (and, by argparse's default, of its own subcommands).

    argparse leaves the arguments a subcommand does not know to the top-level
    parser, which reports them with ITS usage: nothing about the subcommand the
    user typed. Here each subcommand refuses them itself, with its own usage.
    """

    # argparse's own overloads: a namespace given is the one filled in and returned.
    @overload
    def parse_known_args(self, args: Iterable[str] | None = None, namespace: None = None
                         ) -> tuple[argparse.Namespace, list[str]]: ...

    @overload
    def parse_known_args(self, args: Iterable[str] | None, namespace: _N) -> tuple[_N, list[str]]: ...

    @overload
    def parse_known_args(self, *, namespace: _N) -> tuple[_N, list[str]]: ...

    def parse_known_args(self, args: Iterable[str] | None = None, namespace: _N | None = None
                         ) -> tuple[_N | argparse.Namespace, list[str]]:
        parsed, extras = (super().parse_known_args(args) if namespace is None
                          else super().parse_known_args(args, namespace))
        if extras:
            self.error(f"unrecognized arguments: {' '.join(extras)}")
        return parsed, extras


def command_word(argv: list[str]) -> str | None:
    """The command `tide` is asked to run: the first word after the global options."""
    words = iter(argv)
    for word in words:
        if word in _GLOBAL_OPTIONS_WITH_VALUE:
            next(words, None)
        elif not word.startswith("-"):
            return word
        elif word == "--":
            return next(words, None)
    return None


def build_parser(argv: list[str] | None = None) -> argparse.ArgumentParser:
    """The whole parser; given ``argv`` naming a known command, only that command's
    module is imported and registered (its parse is the same)."""
    parser = argparse.ArgumentParser(prog="tide", description="Tidewater command line tools")
    parser.add_argument(
        "--bootstrap-server",
        default=os.environ.get("TIDE_BOOTSTRAP_SERVER", "localhost:9092"),
        help="HOST:PORT of any broker (env TIDE_BOOTSTRAP_SERVER; default localhost:9092); "
             "also accepted after the command, as Kafka's tools take it",
    )
    parser.add_argument(
        "--command-config", metavar="FILE", default=os.environ.get("TIDE_COMMAND_CONFIG"),
        help="Kafka client properties: security.protocol=SSL, ssl.cafile (or ssl.ca.location), "
             "ssl.certfile, ssl.keyfile (env TIDE_COMMAND_CONFIG; `cluster up --tls` writes one); "
             "also accepted after the command")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=SubcommandParser)
    subparsers.required = True
    command = command_word(argv) if argv is not None else None
    wanted = ([COMMAND_MODULES[command]] if command in COMMAND_MODULES
              else SUBCOMMAND_MODULES)
    for name in wanted:
        importlib.import_module(name).register(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = build_parser(argv)
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except CliError as e:
        print(f"tide: {e}", file=sys.stderr)
        return e.exit_code
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return 0


if __name__ == "__main__":
    # `python -m tidewater.tools.cli` runs this file as __main__: call the imported
    # module's main so its CliError is the one subcommands raise.
    from tidewater.tools.cli import main as _main

    sys.exit(_main())
