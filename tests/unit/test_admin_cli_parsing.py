"""The parsers of `tide configs alter`, `tide topics create --replica-assignment` and
`tide records delete` (kafka-configs.sh's, kafka-topics.sh's and
kafka-delete-records.sh's formats)."""

import pytest

from tidewater.tools.cli import CliError
from tidewater.tools.commands.configs import _set_ops, split_config_list
from tidewater.tools.commands.records import parse_offsets_json
from tidewater.tools.commands.topics import parse_replica_assignment

pytestmark = pytest.mark.timeout(30)


def test_config_lists_split_on_commas_outside_brackets():
    assert split_config_list("a=1,b=[x,y],c=2") == ["a=1", "b=[x,y]", "c=2"]
    assert split_config_list(" a=1 ,, ") == ["a=1"]
    ops = _set_ops(["retention.ms=5,cleanup.policy=[compact,delete]", "segment.ms=9"])
    assert [(o.name, o.operation, o.value) for o in ops] == [
        ("retention.ms", "SET", "5"), ("cleanup.policy", "SET", "compact,delete"),
        ("segment.ms", "SET", "9")]
    with pytest.raises(CliError):
        _set_ops(["retention.ms"])


def test_replica_assignment_is_partitions_by_comma_brokers_by_colon():
    assert parse_replica_assignment("1:2,2:3") == ((1, 2), (2, 3))
    assert parse_replica_assignment("3") == ((3,),)
    assert parse_replica_assignment(None) == ()
    with pytest.raises(CliError):
        parse_replica_assignment("1:x")


def test_offsets_json_is_kafkas_file():
    assert parse_offsets_json('{"partitions": [{"topic": "t", "partition": 1, "offset": -1}],'
                              ' "version": 1}') == {("t", 1): -1}
    for bad in ('{"partitions": [{"topic": "t"}]}', "[]", "nope",
                '{"partitions": [{"topic": "t", "partition": 0, "offset": 1},'
                ' {"topic": "t", "partition": 0, "offset": 2}]}'):
        with pytest.raises(CliError):
            parse_offsets_json(bad)
