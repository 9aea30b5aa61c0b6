"""The rosbag2/MCAP format a recording is stored in: message definitions and the writer.

A recording is a rosbag2 directory (``metadata.yaml`` + one ``.mcap`` file) that
``ros2 bag``, ``rosbags`` and the ``mcap`` readers open. Messages are stored exactly as
they travelled (CDR bytes from raw subscriptions, no re-serialisation), with their full
``ros2msg`` definitions, so custom ``fed_ros/msg/ArmCommand`` decodes without this package.
``metadata.yaml`` is written last: a directory without it is an interrupted recording and is
never read.
"""

from __future__ import annotations

import functools
import json
import re
import sys
from pathlib import Path
from typing import Any

import yaml

ROS_DISTRO = "kilted"
METADATA_FILE = "metadata.yaml"
ROSBAG2_VERSION = 9


_PRIMITIVES = {
    "bool",
    "byte",
    "char",
    "float32",
    "float64",
    "int8",
    "uint8",
    "int16",
    "uint16",
    "int32",
    "uint32",
    "int64",
    "uint64",
    "string",
    "wstring",
}
_SEPARATOR = "=" * 80


def _share_dir(package: str) -> Path:
    """Share directory of an installed interface package (ament index, else next to the module).

    The first one that holds msg/: a prefix can have share/<package> without the definitions
    (an overlay with only launch/ and config/).
    """
    import importlib
    import os

    candidates = [
        Path(prefix) / "share" / package
        for prefix in filter(None, os.environ.get("AMENT_PREFIX_PATH", "").split(os.pathsep))
    ]
    candidates.append(Path(sys.prefix) / "share" / package)
    module = importlib.import_module(package)
    for location in getattr(module, "__path__", []):
        parents = Path(location).resolve().parents
        # <prefix>/lib/pythonX.Y/site-packages/<package> -> <prefix>/share/<package>
        if len(parents) > 3:
            candidates.append(parents[3] / "share" / package)
        # A source checkout of an interface package keeps msg/ next to package.xml.
        candidates.append(parents[0])
    for candidate in candidates:
        if (candidate / "msg").is_dir():
            return candidate
    raise FileNotFoundError(f"cannot find the share directory of interface package {package!r}")


def _msg_file(msgtype: str, suffix: str) -> Path:
    package, kind, name = _split_type(msgtype)
    path = _share_dir(package) / kind / f"{name}{suffix}"
    if not path.is_file():
        raise FileNotFoundError(f"no definition for {msgtype!r} at {path}")
    return path


def _split_type(msgtype: str) -> tuple[str, str, str]:
    parts = msgtype.split("/")
    if len(parts) == 2:
        return parts[0], "msg", parts[1]
    if len(parts) == 3:
        return parts[0], parts[1], parts[2]
    raise ValueError(f"malformed message type name {msgtype!r}")


def _dependencies(msgtype: str, text: str) -> list[str]:
    package = _split_type(msgtype)[0]
    found = []
    for line in text.splitlines():
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        field_type = line.split()[0]
        if "=" in field_type:
            continue
        base = re.sub(r"\[.*\]$", "", field_type)
        base = re.sub(r"<=\d+$", "", base)
        if base in _PRIMITIVES:
            continue
        full = base if "/" in base else f"{package}/{base}"
        pkg, _, name = _split_type(full)
        found.append(f"{pkg}/msg/{name}")
    return found


@functools.lru_cache(maxsize=None)
def message_definition(msgtype: str) -> str:
    """Full ros2msg definition (the type, then each dependency once) as rosbag2 writes it."""
    text = _msg_file(msgtype, ".msg").read_text()
    parts, seen, queue = [text.rstrip("\n")], {msgtype}, _dependencies(msgtype, text)
    while queue:
        dep = queue.pop(0)
        if dep in seen:
            continue
        seen.add(dep)
        dep_text = _msg_file(dep, ".msg").read_text()
        package, _, name = _split_type(dep)
        parts.append(f"{_SEPARATOR}\nMSG: {package}/{name}\n{dep_text.rstrip()}")
        queue.extend(_dependencies(dep, dep_text))
    return "\n".join(parts) + "\n"


@functools.lru_cache(maxsize=None)
def type_description_hash(msgtype: str) -> str:
    """RIHS01 type hash of an installed message type ("" when unknown)."""
    try:
        data = json.loads(_msg_file(msgtype, ".json").read_text())
    except FileNotFoundError:
        return ""
    for entry in data.get("type_hashes", []):
        if entry.get("type_name") == msgtype:
            return str(entry.get("hash_string", ""))
    return ""


def qos_metadata(qos) -> list[dict[str, Any]]:
    """rclpy QoSProfile -> rosbag2 v9 ``offered_qos_profiles`` entry list."""

    def duration(d) -> dict[str, int]:
        ns = int(d.nanoseconds)
        return {"sec": ns // 1_000_000_000, "nsec": ns % 1_000_000_000}

    return [
        {
            "history": qos.history.name.lower(),
            "depth": int(qos.depth),
            "reliability": qos.reliability.name.lower(),
            "durability": qos.durability.name.lower(),
            "deadline": duration(qos.deadline),
            "lifespan": duration(qos.lifespan),
            "liveliness": qos.liveliness.name.lower(),
            "liveliness_lease_duration": duration(qos.liveliness_lease_duration),
            "avoid_ros_namespace_conventions": bool(qos.avoid_ros_namespace_conventions),
        }
    ]


class Rosbag2McapWriter:
    """Writes CDR messages into ``<directory>/<name>_0.mcap`` + rosbag2 ``metadata.yaml``."""

    def __init__(self, directory: str | Path) -> None:
        from mcap.writer import CompressionType, Writer

        self.directory = Path(directory)
        if self.directory.exists():
            raise FileExistsError(f"recording directory {self.directory} already exists")
        self.directory.mkdir(parents=True)
        self.file_name = f"{self.directory.name}_0.mcap"
        self._file = open(self.directory / self.file_name, "wb")
        # Uncompressed, like rosbag2's default MCAP preset: cheap to write on a robot.
        self._writer = Writer(self._file, compression=CompressionType.NONE)
        self._writer.start(profile="ros2", library="fed_ros")
        self._schemas: dict[str, int] = {}
        self._topics: dict[str, dict[str, Any]] = {}
        self._start_ns: int | None = None
        self._end_ns = 0
        self._count = 0
        self.closed = False

    def add_topic(self, topic: str, msgtype: str, qos=None) -> None:
        """Declare a topic (once) before writing to it."""
        if topic in self._topics:
            return
        if msgtype not in self._schemas:
            self._schemas[msgtype] = self._writer.register_schema(
                name=msgtype, encoding="ros2msg", data=message_definition(msgtype).encode()
            )
        qos_list = qos_metadata(qos) if qos is not None else []
        digest = type_description_hash(msgtype)
        channel = self._writer.register_channel(
            topic=topic,
            message_encoding="cdr",
            schema_id=self._schemas[msgtype],
            metadata={
                "offered_qos_profiles": yaml.safe_dump(qos_list) if qos_list else "",
                "topic_type_hash": digest,
            },
        )
        self._topics[topic] = {
            "channel": channel,
            "type": msgtype,
            "qos": qos_list,
            "hash": digest,
            "count": 0,
        }

    def write(self, topic: str, data: bytes, log_time_ns: int, publish_time_ns: int = 0) -> None:
        """Append one serialized message."""
        info = self._topics[topic]
        info["count"] += 1
        self._writer.add_message(
            info["channel"],
            log_time=log_time_ns,
            data=bytes(data),
            publish_time=publish_time_ns or log_time_ns,
            sequence=info["count"],
        )
        self._start_ns = log_time_ns if self._start_ns is None else min(self._start_ns, log_time_ns)
        self._end_ns = max(self._end_ns, log_time_ns)
        self._count += 1

    def topic_counts(self) -> dict[str, int]:
        """Messages written per topic so far."""
        return {topic: info["count"] for topic, info in self._topics.items()}

    def close(self, custom_data: dict[str, str]) -> Path:
        """Finish the MCAP file, then write metadata.yaml (last, atomically)."""
        if self.closed:
            return self.directory
        custom = {str(k): str(v) for k, v in custom_data.items()}
        self._writer.add_metadata("fed_ros", custom)
        self._writer.finish()
        self._file.flush()
        self._file.close()
        self.closed = True
        start = self._start_ns or 0
        duration = max(0, self._end_ns - start)
        info = {
            "rosbag2_bagfile_information": {
                "version": ROSBAG2_VERSION,
                "storage_identifier": "mcap",
                "duration": {"nanoseconds": duration},
                "starting_time": {"nanoseconds_since_epoch": start},
                "message_count": self._count,
                "topics_with_message_count": [
                    {
                        "topic_metadata": {
                            "name": topic,
                            "type": t["type"],
                            "serialization_format": "cdr",
                            "offered_qos_profiles": t["qos"],
                            "type_description_hash": t["hash"],
                        },
                        "message_count": t["count"],
                    }
                    for topic, t in self._topics.items()
                ],
                "compression_format": "",
                "compression_mode": "",
                "relative_file_paths": [self.file_name],
                "files": [
                    {
                        "path": self.file_name,
                        "starting_time": {"nanoseconds_since_epoch": start},
                        "duration": {"nanoseconds": duration},
                        "message_count": self._count,
                    }
                ],
                "custom_data": custom,
                "ros_distro": ROS_DISTRO,
            }
        }
        tmp = self.directory / (METADATA_FILE + ".tmp")
        tmp.write_text(yaml.safe_dump(info, sort_keys=False))
        tmp.replace(self.directory / METADATA_FILE)
        return self.directory

    def abort(self) -> None:
        """Close the file without metadata (the directory stays unreadable as a bag)."""
        if not self.closed:
            self.closed = True
            try:
                self._writer.finish()
            finally:
                self._file.close()
