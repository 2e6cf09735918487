"""Issue 15: the tide CLI's Kafka console-tool flags and its argument errors, without a cluster."""

import argparse
from pathlib import Path

import pytest

from tidewater.tools.cli import CliError, build_parser
from tidewater.tools.commands.cluster import up_hints
from tidewater.tools.commands.consume import start_position
from tidewater.tools.commands.kafka_flags import (
    consume_key_format,
    parse_offset,
    produce_key_separator,
    producer_options,
    resolve_topic,
    resolve_topics,
)

pytestmark = pytest.mark.timeout(30)


def usage_error(fn, *args) -> str:
    with pytest.raises(CliError) as info:
        fn(*args)
    assert info.value.exit_code == 2
    return str(info.value)


@pytest.mark.parametrize("text,expected", [("earliest", "earliest"), ("LATEST", "latest"), ("0", 0), ("42", 42)])
def test_offset_words_and_numbers(text, expected):
    assert parse_offset(text) == expected


@pytest.mark.parametrize("text", ["-1", "beginning", "", "1.5"])
def test_bad_offsets_are_refused(text):
    with pytest.raises(argparse.ArgumentTypeError, match="earliest, latest or an offset"):
        parse_offset(text)


def test_topic_positional_or_flag():
    assert resolve_topic("t", None) == resolve_topic(None, "t") == resolve_topic("t", "t") == "t"
    assert "TOPIC or --topic" in usage_error(resolve_topic, None, None)
    assert "'a' and 'b'" in usage_error(resolve_topic, "a", "b")
    assert resolve_topics(["a", "b"], ["c", "a"]) == ["a", "b", "c"]
    assert resolve_topics([], None) == []


def test_producer_keys_follow_kafkas_properties():
    assert produce_key_separator(None, []) is None
    # parse.key=true alone: Kafka's default separator, a tab.
    assert produce_key_separator(None, ["parse.key=true"]) == "\t"
    assert produce_key_separator(None, ["parse.key=TRUE", "key.separator=:"]) == ":"
    # key.separator alone does not parse keys, as in Kafka.
    assert produce_key_separator(None, ["key.separator=:"]) is None
    assert produce_key_separator(":", []) == ":"
    assert produce_key_separator(":", ["key.separator=:", "parse.key=true"]) == ":"


def test_producer_key_flags_that_contradict_are_refused():
    assert "':' and ','" in usage_error(produce_key_separator, ":", ["key.separator=,"])
    assert "parse.key=false" in usage_error(produce_key_separator, ":", ["parse.key=false"])
    assert "true or false" in usage_error(produce_key_separator, None, ["parse.key=yes"])
    assert "must not be empty" in usage_error(produce_key_separator, "", [])
    assert "NAME=VALUE" in usage_error(produce_key_separator, None, ["parse.key"])
    # A misspelt property is an error, not silently ignored; the message lists what works.
    line = usage_error(produce_key_separator, None, ["parse.keys=true"])
    assert "parse.keys" in line and "parse.key, key.separator" in line


def test_consumer_key_format():
    assert consume_key_format(False, None, []) == (False, "\t")
    assert consume_key_format(False, None, ["print.key=true"]) == (True, "\t")
    assert consume_key_format(True, "=", []) == (True, "=")
    assert consume_key_format(False, None, ["print.key=true", "key.separator=:"]) == (True, ":")
    assert "print.key=false" in usage_error(consume_key_format, True, None, ["print.key=false"])
    assert "print.value" in usage_error(consume_key_format, False, None, ["print.value=false"])


def test_producer_properties_meet_tide_options():
    none = {"acks": None, "compression": None, "linger_ms": None, "batch_size": None}
    assert producer_options(none, []) == none
    got = producer_options(none, ["acks=all", "compression.type=ZSTD", "linger.ms=7", "batch.size=100"])
    assert got == {"acks": "all", "compression": "zstd", "linger_ms": "7", "batch_size": "100"}
    # -1 and all are one setting, typed either way.
    assert producer_options({**none, "acks": "-1"}, ["acks=all"])["acks"] == "all"
    assert "'1' and 'all'" in usage_error(producer_options, {**none, "acks": "1"}, ["acks=all"])
    assert "retries" in usage_error(producer_options, none, ["retries=3"])


def test_an_offset_the_partition_does_not_hold_starts_at_the_end():
    assert start_position(5, log_start=0, log_end=10) == 5
    assert start_position(10, log_start=0, log_end=10) == 10
    assert start_position(11, log_start=0, log_end=10) == 10
    assert start_position(2, log_start=4, log_end=10) == 10


def test_bootstrap_server_before_or_after_the_subcommand():
    parser = build_parser()
    after = parser.parse_args(["topics", "list", "--bootstrap-server", "h:1"])
    assert after.bootstrap_server == "h:1"
    before = parser.parse_args(["--bootstrap-server", "h:2", "consume", "t"])
    assert before.bootstrap_server == "h:2"  # not reset by the subcommand's absent option
    both = parser.parse_args(["--bootstrap-server", "h:2", "produce", "--bootstrap-server", "h:3", "t"])
    assert both.bootstrap_server == "h:3"


@pytest.mark.parametrize("argv,usage", [
    (["consume", "t", "--bogus"], "usage: tide consume"),
    (["topics", "create", "t", "--bogus", "1"], "usage: tide topics create"),
    (["produce", "t", "--acks", "7"], "usage: tide produce"),
])
def test_argument_errors_show_the_subcommands_usage(argv, usage, capsys):
    with pytest.raises(SystemExit) as info:
        build_parser().parse_args(argv)
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith(usage), err
    assert "COMMAND ..." not in err  # not the top-level usage


def test_create_help_text_explains_minus_one(capsys):
    with pytest.raises(SystemExit):
        build_parser().parse_args(["topics", "create", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "-1 (the default) means the cluster's num.partitions" in text
    assert "-1 (the default) means the cluster's default.replication.factor" in text


def test_up_hints():
    text = up_hints(Path("/d"), "127.0.0.1:1,127.0.0.1:2", "127.0.0.1:3", restarted=False)
    lines = text.splitlines()
    assert lines[0] == "export TIDE_BOOTSTRAP_SERVER=127.0.0.1:1,127.0.0.1:2"
    assert lines[1].startswith("export TIDE_KAFKA_BOOTSTRAP=127.0.0.1:3 ")
    assert "restarted" not in text
    again = up_hints(Path("/d"), "127.0.0.1:1", None, restarted=True)
    assert again.splitlines() == ["# restarted the cluster in /d: its topics and records are kept",
                                  "export TIDE_BOOTSTRAP_SERVER=127.0.0.1:1"]


@pytest.mark.parametrize("argv,expected", [
    ([], None),
    (["--producer-property", "enable.idempotence=false"], False),
    (["--producer-property", "enable.idempotence=TRUE"], True),
    (["--acks", "1", "--producer-property", "enable.idempotence=false"], False),
])
def test_enable_idempotence_as_a_producer_property(argv, expected):
    from tidewater.tools.commands.produce import producer_settings

    args = build_parser().parse_args(["produce", "t", *argv])
    assert producer_settings(args)["enable_idempotence"] is expected


@pytest.mark.parametrize("argv,message", [
    (["--producer-property", "enable.idempotence=maybe"], "true or false"),
    (["--acks", "1", "--producer-property", "enable.idempotence=true"], "needs acks=all"),
])
def test_bad_enable_idempotence_is_refused(argv, message):
    from tidewater.tools.commands.produce import producer_settings

    args = build_parser().parse_args(["produce", "t", *argv])
    assert message in usage_error(producer_settings, args)


def test_the_command_table_names_every_command_and_its_module():
    """`tide CMD` imports only COMMAND_MODULES[CMD]: the table must say exactly what
    each module registers, else a command would be missing or lose its arguments."""
    import argparse
    import importlib

    from tidewater.tools.cli import COMMAND_MODULES, SUBCOMMAND_MODULES

    registered: dict[str, str] = {}
    for module in SUBCOMMAND_MODULES:
        parser = argparse.ArgumentParser()
        subparsers = parser.add_subparsers()
        importlib.import_module(module).register(subparsers)
        for name in subparsers.choices:
            registered[name] = module
    assert registered == COMMAND_MODULES


@pytest.mark.parametrize(("argv", "word"), [
    (["produce", "t"], "produce"),
    (["--bootstrap-server", "h:1", "topics", "list"], "topics"),
    (["--bootstrap-server=h:1", "--command-config", "f", "consume"], "consume"),
    (["--help"], None), ([], None)])
def test_the_command_word_is_found_after_the_global_options(argv, word):
    from tidewater.tools.cli import command_word

    assert command_word(argv) == word


def test_one_commands_parse_equals_the_full_parsers():
    argv = ["--bootstrap-server", "h:1", "produce", "t", "--acks", "1", "--linger-ms", "7"]
    assert vars(build_parser(argv).parse_args(argv)) == vars(build_parser().parse_args(argv))
