"""Helpers shared by the tide subcommands: client construction and error mapping."""

from __future__ import annotations

import argparse
import contextlib
from collections.abc import Iterator

from tidewater.client.metadata import parse_bootstrap
from tidewater.client.security import (
    SecurityConfigError,
    SecurityOptions,
    parse_properties,
    properties_security,
    security_kwargs,
)
from tidewater.proto.errors import TidewaterError
from tidewater.tools.cli import CliError


def add_bootstrap_argument(parser: argparse.ArgumentParser) -> None:
    """``--bootstrap-server`` after the subcommand too (``tide topics list --bootstrap-server H:P``),
    where Kafka's tools take it. SUPPRESS: when absent here, the top-level value (or its
    environment default) stays."""
    parser.add_argument("--bootstrap-server", default=argparse.SUPPRESS, metavar="HOST:PORT",
                        help="any broker; overrides `tide --bootstrap-server` and TIDE_BOOTSTRAP_SERVER")
    parser.add_argument("--command-config", default=argparse.SUPPRESS, metavar="FILE",
                        help="Kafka client properties (security.protocol, ssl.cafile, "
                             "ssl.certfile, ssl.keyfile, sasl.mechanism, sasl.username, "
                             "sasl.password); overrides TIDE_COMMAND_CONFIG")


def bootstrap_of(args: argparse.Namespace) -> str:
    """The validated --bootstrap-server value."""
    try:
        parse_bootstrap(args.bootstrap_server)
    except ValueError as e:
        raise CliError(f"--bootstrap-server: {e}", exit_code=2) from None
    bootstrap: str = args.bootstrap_server
    return bootstrap


def security_of(args: argparse.Namespace) -> SecurityOptions:
    """The clients' TLS and SASL keyword arguments from --command-config (none:
    plaintext)."""
    path = getattr(args, "command_config", None)
    if not path:
        return {}
    try:
        with open(path, encoding="utf-8") as f:
            security = properties_security(parse_properties(f.read()))
    except OSError as e:
        raise CliError(f"--command-config {path}: {e.strerror}", exit_code=2) from None
    except SecurityConfigError as e:
        raise CliError(f"--command-config {path}: {e}", exit_code=2) from None
    return security_kwargs(security)


def parse_configs(pairs: list[str] | None) -> dict[str, str]:
    """['k=v', ...] -> dict; a pair without '=' is a usage error."""
    out = {}
    for pair in pairs or ():
        name, sep, value = pair.partition("=")
        if not sep or not name.strip():
            raise CliError(f"bad config {pair!r}: expected KEY=VALUE", exit_code=2)
        out[name.strip()] = value
    return out


def describe_error(e: TidewaterError) -> str:
    """One line: the message, plus the wire code name when the message does not already say it."""
    text = str(e) or e.error_name
    if e.error_name not in text:
        text = f"{text} ({e.error_name})"
    return " ".join(text.split())


@contextlib.contextmanager
def cli_errors(action: str) -> Iterator[None]:
    """Turn typed client errors into one-line CliErrors ``<action>: <reason>``."""
    try:
        yield
    except CliError:
        raise
    except TidewaterError as e:
        raise CliError(f"{action}: {describe_error(e)}") from None
    except ValueError as e:
        raise CliError(f"{action}: {e}", exit_code=2) from None
