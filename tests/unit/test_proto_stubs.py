"""The committed gRPC stubs must match proto/tidewater.proto (run `make proto`)."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
GENERATED = ["tidewater_pb2.py", "tidewater_pb2.pyi", "tidewater_pb2_grpc.py"]


def test_generated_stubs_are_current(tmp_path):
    (tmp_path / "proto").mkdir()
    (tmp_path / "proto" / "tidewater.proto").write_bytes((ROOT / "proto" / "tidewater.proto").read_bytes())
    subprocess.run(
        [sys.executable, "-m", "grpc_tools.protoc", "-I.", "--python_out=.", "--pyi_out=.",
         "--grpc_python_out=.", "proto/tidewater.proto"],
        cwd=tmp_path, check=True,
    )
    for name in GENERATED:
        fresh = (tmp_path / "proto" / name).read_text()
        committed = (ROOT / "proto" / name).read_text()
        assert fresh == committed, f"proto/{name} is stale: run `make proto`"


def test_error_codes_keep_kafka_numbers():
    from proto import tidewater_pb2 as pb

    expected = {
        "NONE": 0, "OFFSET_OUT_OF_RANGE": 1, "CORRUPT_MESSAGE": 2, "UNKNOWN_TOPIC_OR_PARTITION": 3,
        "NOT_LEADER_OR_FOLLOWER": 6, "REQUEST_TIMED_OUT": 7, "MESSAGE_TOO_LARGE": 10,
        "STALE_CONTROLLER_EPOCH": 11, "INVALID_TOPIC_EXCEPTION": 17, "NOT_ENOUGH_REPLICAS": 19,
        "NOT_ENOUGH_REPLICAS_AFTER_APPEND": 20, "INVALID_REQUIRED_ACKS": 21,
        "TOPIC_ALREADY_EXISTS": 36, "INVALID_PARTITIONS": 37, "INVALID_REPLICATION_FACTOR": 38,
        "KAFKA_STORAGE_ERROR": 56, "FENCED_LEADER_EPOCH": 74, "UNKNOWN_LEADER_EPOCH": 75,
    }
    for name, number in expected.items():
        assert pb.ErrorCode.Value(name) == number
