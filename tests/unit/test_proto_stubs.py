"""The committed gRPC stubs must match proto/tidewater.proto (run `make proto`)."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
GENERATED = ["tidewater_pb2.py", "tidewater_pb2.pyi", "tidewater_pb2_grpc.py"]


def test_generated_stubs_are_current(tmp_path):
    # Generated as tidewater/proto/tidewater.proto, as `make proto` does: the stubs then
    # import each other under the installed namespace (tidewater.proto.*).
    out = tmp_path / "tidewater" / "proto"
    out.mkdir(parents=True)
    (out / "tidewater.proto").write_bytes((ROOT / "proto" / "tidewater.proto").read_bytes())
    subprocess.run(
        [sys.executable, "-m", "grpc_tools.protoc", "-I.", "--python_out=.", "--pyi_out=.",
         "--grpc_python_out=.", "tidewater/proto/tidewater.proto"],
        cwd=tmp_path, check=True,
    )
    for name in GENERATED:
        fresh = (out / name).read_text()
        committed = (ROOT / "proto" / name).read_text()
        assert fresh == committed, f"proto/{name} is stale: run `make proto`"


def test_error_codes_keep_kafka_numbers():
    from tidewater.proto import tidewater_pb2 as pb

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


def _stub_floors() -> dict[str, str]:
    """The versions the committed stubs refuse to run below: grpcio and protobuf."""
    import re

    grpc_stub = (ROOT / "proto" / "tidewater_pb2_grpc.py").read_text()
    grpc_version = re.search(r"GRPC_GENERATED_VERSION = '([\d.]+)'", grpc_stub).group(1)
    pb_stub = (ROOT / "proto" / "tidewater_pb2.py").read_text()
    major, minor, patch = re.search(
        r"Domain\.PUBLIC,\s*(\d+),\s*(\d+),\s*(\d+),", pb_stub).groups()
    return {"grpcio": grpc_version, "protobuf": f"{major}.{minor}.{patch}"}


def _just_below(version: str) -> str:
    """The highest x.y.z release before ``version`` (x.y.z): 1.85.1 -> 1.85.0, 1.86.0 -> 1.85.9999."""
    parts = [int(p) for p in version.split(".")]
    for i in reversed(range(len(parts))):
        if parts[i] > 0:
            parts[i] -= 1
            parts[i + 1:] = [9999] * (len(parts) - i - 1)
            return ".".join(map(str, parts))
    raise ValueError(f"nothing is below {version}")


def test_just_below():
    assert _just_below("1.85.1") == "1.85.0"
    assert _just_below("1.86.0") == "1.85.9999"
    assert _just_below("8.0.0") == "7.9999.9999"


def test_declared_dependencies_admit_no_runtime_the_stubs_refuse():
    # A plain `pip install` (the Docker image's wheels) resolves from pyproject alone: a
    # floor below the stubs' own would let it pick a grpcio or protobuf that fails at import.
    import tomllib

    from packaging.requirements import Requirement
    from packaging.version import Version

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    declared = {r.name: r.specifier for r in map(Requirement, project["dependencies"])}
    floors = _stub_floors()
    for name, floor in floors.items():
        assert Version(floor) in declared[name], f"{name} {declared[name]} refuses {floor}"
        assert Version(_just_below(floor)) not in declared[name], (
            f"{name} {declared[name]} admits versions below the stubs' floor {floor}")
    # The stubs test regenerates them: only the generator that wrote them gives the same bytes.
    tools = next(Requirement(r) for r in project["optional-dependencies"]["dev"]
                 if Requirement(r).name == "grpcio-tools")
    assert str(tools.specifier) == f"=={floors['grpcio']}"
