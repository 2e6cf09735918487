"""The demo's story names example record values; one read back may have a null value."""

from tidewater.tools.demo import value_examples


def test_examples_name_null_and_undecodable_values_instead_of_failing():
    # A record nobody sent (the story's "unknown") may have a null value or other bytes:
    # the examples once called .decode() on each and failed on None.
    assert value_examples([b"record-000001-attempt-1", None, b"\xff"]) == (
        "record-000001-attempt-1, null, \ufffd")


def test_examples_are_the_first_few():
    assert value_examples([str(i).encode() for i in range(9)]) == "0, 1, 2, 3, 4"
