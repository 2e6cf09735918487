"""``meta.properties``: the cluster a broker's data dir belongs to (Kafka's file, version 0).

Java properties text, UTF-8, one ``key=value`` per line; lines starting with
``#`` are comments::

    #Written by Tidewater: the cluster this data dir belongs to
    version=0
    broker.id=1
    cluster.id=5f0c8e3a9d2b4c71a0e6b1f2c3d4e5f6

It is written (atomically: ``.tmp``, fsync, rename, directory fsync) the first
time the broker hears a cluster ID from the controller, and never changed
afterwards. A controller with another cluster ID (its metadata was wiped, or
the broker was pointed at another cluster) may not make this broker delete or
replace any log (``topic_identity.cluster_id_decision``); the audit reads
``broker.id`` from the same file.

Reading: a missing file is ``None``; a line without ``=``, a version other
than 0, a ``broker.id`` that is not an integer or an empty ``cluster.id`` is a
``CorruptFileError`` with the path and line.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from tidewater.broker.storage.checkpoints import read_file_bytes, write_file_atomically
from tidewater.proto.errors import CorruptFileError

META_PROPERTIES_FILE = "meta.properties"
VERSION = 0


@dataclass(frozen=True, slots=True)
class MetaProperties:
    broker_id: int
    cluster_id: str


def encode_meta_properties(meta: MetaProperties) -> bytes:
    return (f"#Written by Tidewater: the cluster this data dir belongs to\n"
            f"version={VERSION}\nbroker.id={meta.broker_id}\ncluster.id={meta.cluster_id}\n"
            ).encode()


def decode_meta_properties(data: bytes, path: str = META_PROPERTIES_FILE) -> MetaProperties:
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise CorruptFileError(f"not UTF-8: {e}", path=path) from None
    values: dict[str, tuple[str, int]] = {}
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith(("#", "!")):
            continue
        key, sep, value = line.partition("=")
        if not sep:
            raise CorruptFileError(f"expected key=value, found {raw!r}", path=path, line=number)
        values[key.strip()] = (value.strip(), number)
    version, line_number = values.get("version", ("", 0))
    if version != str(VERSION):
        raise CorruptFileError(f"unsupported version {version!r}", path=path,
                               line=line_number or None)
    broker_id, line_number = values.get("broker.id", ("", 0))
    if not broker_id.lstrip("-").isdigit():
        raise CorruptFileError(f"bad broker.id {broker_id!r}", path=path, line=line_number or None)
    cluster_id, line_number = values.get("cluster.id", ("", 0))
    if not cluster_id:
        raise CorruptFileError("no cluster.id", path=path, line=line_number or None)
    return MetaProperties(int(broker_id), cluster_id)


def read_meta_properties(data_dir: Path) -> MetaProperties | None:
    path = Path(data_dir) / META_PROPERTIES_FILE
    data = read_file_bytes(path)
    return None if data is None else decode_meta_properties(data, str(path))


def write_meta_properties(data_dir: Path, meta: MetaProperties) -> None:
    write_file_atomically(Path(data_dir) / META_PROPERTIES_FILE, encode_meta_properties(meta))
