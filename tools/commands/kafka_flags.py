"""Kafka's console-tool flags, mapped onto tide's own options.

Kafka users type ``--topic NAME``, ``--property parse.key=true``,
``--producer-property acks=all`` and ``--offset earliest``; tide accepts them
beside its own spellings (a positional TOPIC, ``--key-separator``, ``--acks``).
Everything here is pure: parsed argument values in, resolved values out, a
``CliError`` (exit code 2) for bad or contradictory input. Saying the same
thing both ways is fine; saying two different things is refused, not guessed.
"""

from __future__ import annotations

import argparse
from typing import TypeVar, overload

from tidewater.tools.cli import CliError

_T = TypeVar("_T")

# Kafka's console producer and consumer split/join keys and values with a tab by default.
DEFAULT_KEY_SEPARATOR = "\t"

PRODUCE_PROPERTIES = ("parse.key", "key.separator")
CONSUME_PROPERTIES = ("print.key", "key.separator")
# --producer-property NAME -> the tide option it sets (the same values are accepted).
PRODUCER_PROPERTY_OPTIONS = {"acks": "acks", "compression.type": "compression",
                             "linger.ms": "linger_ms", "batch.size": "batch_size",
                             "enable.idempotence": "enable_idempotence"}


def usage_error(message: str) -> CliError:
    return CliError(message, exit_code=2)


def parse_offset(text: str) -> int | str:
    """``--offset``'s value: ``earliest``, ``latest`` or an offset >= 0 (argparse type)."""
    word = text.strip().lower()
    if word in ("earliest", "latest"):
        return word
    try:
        offset = int(word)
    except ValueError:
        offset = -1
    if offset < 0:
        raise argparse.ArgumentTypeError(f"expected earliest, latest or an offset >= 0, not {text!r}")
    return offset


def parse_properties(pairs: list[str] | None, known: tuple[str, ...], flag: str) -> dict[str, str]:
    """['name=value', ...] for ``flag`` -> dict; refuses names tide does not act on, so a
    misspelt property is not silently ignored."""
    out: dict[str, str] = {}
    for pair in pairs or ():
        name, sep, value = pair.partition("=")
        name = name.strip()
        if not sep or not name:
            raise usage_error(f"{flag} {pair!r}: expected NAME=VALUE")
        if name not in known:
            raise usage_error(f"{flag} {name}: not supported (supported: {', '.join(known)})")
        if name in out and out[name] != value:
            raise usage_error(f"{flag} {name} given twice: {out[name]!r} and {value!r}")
        out[name] = value
    return out


def parse_bool(flag: str, name: str, value: str) -> bool:
    word = value.strip().lower()
    if word not in ("true", "false"):
        raise usage_error(f"{flag} {name}={value}: expected true or false")
    return word == "true"


@overload
def one_value(what: str, tide_value: _T | None, kafka_value: _T | None) -> _T | None: ...


@overload
def one_value(what: str, tide_value: _T | None, kafka_value: _T | None, default: _T) -> _T: ...


def one_value(what: str, tide_value: _T | None, kafka_value: _T | None,
              default: _T | None = None) -> _T | None:
    """The value given by tide's option or by the Kafka spelling; both given must agree."""
    if tide_value is not None and kafka_value is not None and tide_value != kafka_value:
        raise usage_error(f"{what} given twice with different values: {tide_value!r} and {kafka_value!r}")
    for value in (tide_value, kafka_value):
        if value is not None:
            return value
    return default


def resolve_topic(positional: str | None, flag: str | None) -> str:
    """TOPIC or --topic TOPIC (one of them, or both the same)."""
    topic = one_value("the topic (TOPIC and --topic)", positional, flag)
    if topic is None:
        raise usage_error("a topic is required: TOPIC or --topic TOPIC")
    return topic


def resolve_topics(positional: list[str] | None, flags: list[str] | None) -> list[str]:
    """NAME... and any number of --topic NAME, in order, each once."""
    return list(dict.fromkeys([*(positional or ()), *(flags or ())]))


def produce_key_separator(key_separator: str | None, properties: list[str] | None) -> str | None:
    """The separator that splits each line into key and value, or None for value-only lines.

    ``--key-separator SEP`` is tide's short form of Kafka's
    ``--property parse.key=true --property key.separator=SEP``. As in Kafka,
    ``key.separator`` alone does not turn key parsing on, and it defaults to a tab.
    """
    props = parse_properties(properties, PRODUCE_PROPERTIES, "--property")
    parse_key = parse_bool("--property", "parse.key", props["parse.key"]) if "parse.key" in props else None
    if key_separator is not None and parse_key is False:
        raise usage_error("--key-separator parses keys but --property parse.key=false says not to")
    separator = one_value("the key separator (--key-separator and --property key.separator)",
                          key_separator, props.get("key.separator"), DEFAULT_KEY_SEPARATOR)
    if not (parse_key or key_separator is not None):
        return None
    if separator == "":
        raise usage_error("the key separator must not be empty")
    return separator


def consume_key_format(print_key: bool, key_separator: str | None,
                       properties: list[str] | None) -> tuple[bool, str]:
    """(print the key?, separator) from ``--print-key``/``--key-separator`` and Kafka's
    ``--property print.key=true``/``--property key.separator=SEP``."""
    props = parse_properties(properties, CONSUME_PROPERTIES, "--property")
    prop_print_key = parse_bool("--property", "print.key", props["print.key"]) if "print.key" in props else None
    if print_key and prop_print_key is False:
        raise usage_error("--print-key prints keys but --property print.key=false says not to")
    separator = one_value("the key separator (--key-separator and --property key.separator)",
                          key_separator, props.get("key.separator"), DEFAULT_KEY_SEPARATOR)
    return bool(print_key or prop_print_key), separator


def producer_options(given: dict[str, str | None], properties: list[str] | None) -> dict[str, str | None]:
    """Kafka's ``--producer-property`` names applied to tide's producer options.

    ``given`` maps option names (``acks``, ``compression``, ``linger_ms``,
    ``batch_size``) to what was typed as text, None when not typed. Returns
    each option's value as text (acks ``-1`` reads ``all``), None still
    meaning "not given"; checking the values is the caller's job.
    """
    props = parse_properties(properties, tuple(PRODUCER_PROPERTY_OPTIONS), "--producer-property")
    by_option = {option: props.get(name) for name, option in PRODUCER_PROPERTY_OPTIONS.items()}
    out: dict[str, str | None] = {}
    for option, typed in given.items():
        flag = f"--{option.replace('_', '-')}"
        out[option] = one_value(f"{option} ({flag} and --producer-property)",
                                _normal(option, typed), _normal(option, by_option.get(option)))
    return out


def _normal(option: str, value: str | None) -> str | None:
    """One spelling per meaning, so that ``--acks -1`` and ``acks=all`` agree."""
    if value is None:
        return None
    value = value.strip().lower()
    return "all" if option == "acks" and value == "-1" else value
