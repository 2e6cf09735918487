"""Ack-log lines, stdin line splitting, acks parsing and consume output formatting."""

import json

import pytest

from tidewater.client.accumulator import RecordMetadata
from tidewater.client.consumer import ConsumerRecord
from tidewater.client.metadata import parse_bootstrap
from tidewater.client.producer import parse_acks
from tidewater.proto.errors import InvalidRequiredAcksError
from tidewater.tools.commands._common import parse_configs
from tidewater.tools.commands.consume import format_record
from tidewater.tools.commands.produce import ack_log_line, split_line


def test_ack_log_line_is_one_json_object_with_the_contract_fields():
    line = ack_log_line(RecordMetadata("orders", 2, 41, 123), b"k1", b"hello", "all")
    assert line.endswith("\n") and line.count("\n") == 1
    assert json.loads(line) == {"topic": "orders", "partition": 2, "offset": 41,
                                "key": "k1", "value": "hello", "acks": "all"}


def test_ack_log_line_without_key_and_with_non_utf8_bytes():
    line = ack_log_line(RecordMetadata("t", 0, 0, 0), None, b"\xff\xfeok", "1")
    obj = json.loads(line)
    assert obj["key"] is None
    # Undecodable bytes survive as surrogate escapes: nothing is lost.
    assert obj["value"].encode("utf-8", errors="surrogateescape") == b"\xff\xfeok"


def test_split_line():
    assert split_line(b"a:b:c", b":") == (b"a", b"b:c")
    assert split_line(b"plain", None) == (None, b"plain")
    assert split_line(b":v", b":") == (b"", b"v")
    with pytest.raises(ValueError, match="no key separator"):
        split_line(b"nokey", b":")


@pytest.mark.parametrize("text,acks", [("all", -1), ("-1", -1), ("0", 0), ("1", 1), (1, 1)])
def test_parse_acks(text, acks):
    assert parse_acks(text) == acks


def test_parse_acks_rejects_others():
    with pytest.raises(InvalidRequiredAcksError):
        parse_acks("2")


def test_parse_configs_and_bootstrap():
    assert parse_configs(["a=1", "b.c=x=y"]) == {"a": "1", "b.c": "x=y"}
    assert parse_bootstrap("h1:1,h2:2") == [("h1", 1), ("h2", 2)]
    for bad in ("", "host", "host:0", "host:x", ":9092"):
        with pytest.raises(ValueError):
            parse_bootstrap(bad)


def test_format_record_plain_json_and_key():
    r = ConsumerRecord("t", 1, 7, b"k", b"v\xff", 99, 3, (("h", b"x"), ("n", None)))
    assert format_record(r, as_json=False, print_key=False, key_separator=b"\t") == b"v\xff\n"
    assert format_record(r, as_json=False, print_key=True, key_separator=b"|") == b"k|v\xff\n"
    obj = json.loads(format_record(r, as_json=True, print_key=False, key_separator=b"\t"))
    assert obj == {"topic": "t", "partition": 1, "offset": 7, "key": "k", "value": "v\udcff",
                   "timestamp": 99, "leader_epoch": 3, "headers": [["h", "x"], ["n", None]]}
