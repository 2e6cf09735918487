"""Every input saved under tests/fuzz/corpus (seeds and what ``make fuzz`` found) through its
target: each ends normally or in one of the parser's typed errors (tests/fuzz/targets.py)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

TESTS_DIR = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(TESTS_DIR))

from fuzz.targets import TARGETS, run_one  # noqa: E402

CORPUS = TESTS_DIR / "fuzz" / "corpus"
INPUTS = sorted(p for p in CORPUS.glob("*/*") if p.is_file())


def test_every_target_has_seeds():
    assert {p.parent.name for p in INPUTS} == set(TARGETS)


@pytest.mark.timeout(30)
@pytest.mark.parametrize("path", INPUTS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_saved_input(path):
    run_one(path.parent.name, path.read_bytes())


@pytest.mark.timeout(60)
def test_every_advertised_api_version_has_a_valid_seed():
    """kafka_request's corpus holds a request for every (api_key, api_version) the listener
    decodes (``python -m fuzz.seeds`` remakes them when apis.SUPPORTED grows), and each
    decodes as that pair."""
    from fuzz.seeds import advertised

    from tidewater.broker.kafka import apis
    from tidewater.broker.kafka.codec import decode_request

    for api_key, api_version in advertised():
        frame = (CORPUS / "kafka_request" / f"seed-key{api_key}-v{api_version}").read_bytes()
        head, _body = decode_request(frame, apis.SUPPORTED)
        assert (head.api_key, head.api_version) == (api_key, api_version)


@pytest.mark.timeout(30)
def test_the_frame_target_checks_what_the_transport_reads():
    """kafka_frame compares FrameConnection with a plain reading: a frame cut short at
    the end, a refused size after a good frame."""
    from fuzz.targets import _frames_expected, kafka_frame

    stream = (3).to_bytes(4, "big") + b"abc" + (300).to_bytes(4, "big") + b"x"
    assert _frames_expected(stream, 253) == ([b"abc"], 300)
    assert _frames_expected(stream[:9], 253) == ([b"abc"], None)
    for chunk_seed in range(8):
        kafka_frame(bytes([63, chunk_seed]) + stream)
        kafka_frame(bytes([63, chunk_seed]) + stream[:9])
