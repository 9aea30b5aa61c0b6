"""Demonstration recording: an arm's topics -> MCAP in rosbag2 layout -> :class:`Episode`.

A recording is a rosbag2 directory (``metadata.yaml`` + one ``.mcap`` file) that
``ros2 bag``, ``rosbags`` and the ``mcap`` readers open. Messages are stored exactly as
they travelled (CDR bytes from raw subscriptions, no re-serialisation), with their full
``ros2msg`` definitions, so custom ``fed_ros/msg/ArmCommand`` decodes without this package.
Episode metadata (robot, task, instruction, variation, success) lives in the bag's
``custom_data``. ``metadata.yaml`` is written last: a directory without it is an
interrupted recording and is never read.

Synchronisation rule (see :mod:`fed_ros.ros.arm.topics`): step ``k`` of the episode is
the ``arm/applied_command`` stamped ``s_k`` (the action the driver applied) paired with
the observation messages stamped ``s_k``. Recorded actions therefore are exactly the
applied ones, whether the command came late, was rejected or the arm held still.
"""
from __future__ import annotations

import functools
import json
import re
import shutil
import struct
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from fed_ros.core.episode import (
    ACTION_DIM, AGENTVIEW_IMAGE, EEF_POS, EEF_QUAT, GRIPPER_QPOS, IMAGE_KEYS, JOINT_POS,
    OBJECT_STATE, WRIST_IMAGE, Episode)
from fed_ros.ros import shutdown
from fed_ros.ros.arm import topics as at

ROS_DISTRO = "kilted"
METADATA_FILE = "metadata.yaml"
EPISODE_CACHE = "episode.npz"
ROSBAG2_VERSION = 9

# Relative topic -> message type recorded from an arm.
RECORDED_TOPICS: dict[str, str] = {
    at.AGENTVIEW_TOPIC: "sensor_msgs/msg/Image",
    at.WRIST_TOPIC: "sensor_msgs/msg/Image",
    at.JOINT_STATES_TOPIC: "sensor_msgs/msg/JointState",
    at.GRIPPER_STATE_TOPIC: "sensor_msgs/msg/JointState",
    at.EEF_POSE_TOPIC: "geometry_msgs/msg/PoseStamped",
    at.OBJECT_STATE_TOPIC: "std_msgs/msg/Float32MultiArray",
    at.TASK_TOPIC: "std_msgs/msg/String",
    at.COMMAND_TOPIC: "fed_ros/msg/ArmCommand",
    at.APPLIED_COMMAND_TOPIC: "fed_ros/msg/ArmCommand",
    at.EPISODE_STATUS_TOPIC: "fed_ros/msg/EpisodeStatus",
}
# Topics every step needs; images only when the recording has cameras.
STATE_TOPICS = (at.JOINT_STATES_TOPIC, at.GRIPPER_STATE_TOPIC, at.EEF_POSE_TOPIC,
                at.OBJECT_STATE_TOPIC)
IMAGE_TOPICS = (at.AGENTVIEW_TOPIC, at.WRIST_TOPIC)
# With camera_transport "compressed" the cameras' CompressedImage streams are recorded instead,
# as they arrived (JPEG/PNG bytes); frames are decoded and resized when converted to an episode.
COMPRESSED_TOPICS = {at.camera_topic(rel, "compressed"): at.CAMERA_MSGTYPES["compressed"]
                     for rel in IMAGE_TOPICS}
SPINE_TOPICS = (at.APPLIED_COMMAND_TOPIC, at.EPISODE_STATUS_TOPIC)


class RecordingError(ValueError):
    """A recording that cannot become a training episode (names the reason)."""


# --- message definitions (ros2msg, as rosbag2 stores them) ---------------------------------

_PRIMITIVES = {"bool", "byte", "char", "float32", "float64", "int8", "uint8", "int16", "uint16",
               "int32", "uint32", "int64", "uint64", "string", "wstring"}
_SEPARATOR = "=" * 80


def _share_dir(package: str) -> Path:
    """Share directory of an installed interface package (ament index, else next to the module).

    The first one that holds msg/: a prefix can have share/<package> without the definitions
    (an overlay with only launch/ and config/).
    """
    import importlib
    import os
    candidates = [Path(prefix) / "share" / package
                  for prefix in filter(None, os.environ.get("AMENT_PREFIX_PATH", "").split(os.pathsep))]
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
    return [{
        "history": qos.history.name.lower(), "depth": int(qos.depth),
        "reliability": qos.reliability.name.lower(), "durability": qos.durability.name.lower(),
        "deadline": duration(qos.deadline), "lifespan": duration(qos.lifespan),
        "liveliness": qos.liveliness.name.lower(),
        "liveliness_lease_duration": duration(qos.liveliness_lease_duration),
        "avoid_ros_namespace_conventions": bool(qos.avoid_ros_namespace_conventions),
    }]


# --- rosbag2 MCAP writer ------------------------------------------------------------------

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
                name=msgtype, encoding="ros2msg", data=message_definition(msgtype).encode())
        qos_list = qos_metadata(qos) if qos is not None else []
        digest = type_description_hash(msgtype)
        channel = self._writer.register_channel(
            topic=topic, message_encoding="cdr", schema_id=self._schemas[msgtype],
            metadata={"offered_qos_profiles": yaml.safe_dump(qos_list) if qos_list else "",
                      "topic_type_hash": digest})
        self._topics[topic] = {"channel": channel, "type": msgtype, "qos": qos_list,
                               "hash": digest, "count": 0}

    def write(self, topic: str, data: bytes, log_time_ns: int, publish_time_ns: int = 0) -> None:
        """Append one serialized message."""
        info = self._topics[topic]
        info["count"] += 1
        self._writer.add_message(info["channel"], log_time=log_time_ns, data=bytes(data),
                                 publish_time=publish_time_ns or log_time_ns,
                                 sequence=info["count"])
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
        info = {"rosbag2_bagfile_information": {
            "version": ROSBAG2_VERSION,
            "storage_identifier": "mcap",
            "duration": {"nanoseconds": duration},
            "starting_time": {"nanoseconds_since_epoch": start},
            "message_count": self._count,
            "topics_with_message_count": [
                {"topic_metadata": {"name": topic, "type": t["type"], "serialization_format": "cdr",
                                    "offered_qos_profiles": t["qos"],
                                    "type_description_hash": t["hash"]},
                 "message_count": t["count"]}
                for topic, t in self._topics.items()],
            "compression_format": "",
            "compression_mode": "",
            "relative_file_paths": [self.file_name],
            "files": [{"path": self.file_name, "starting_time": {"nanoseconds_since_epoch": start},
                       "duration": {"nanoseconds": duration}, "message_count": self._count}],
            "custom_data": custom,
            "ros_distro": ROS_DISTRO,
        }}
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


# --- CDR peeking (stamps without deserialising images) --------------------------------------

def cdr_header_stamp_ns(data: bytes) -> int:
    """Stamp of a CDR message whose first field is std_msgs/Header."""
    if len(data) < 12:
        raise ValueError(f"CDR message of {len(data)} bytes is too short for a header")
    little = data[1] & 1  # encapsulation id 0x0001 = CDR little-endian
    sec, nanosec = struct.unpack_from("<iI" if little else ">iI", data, 4)
    return sec * 1_000_000_000 + nanosec


def cdr_object_state_stamp_ns(data: bytes) -> int:
    """Stamp carried in the first layout label of a CDR Float32MultiArray."""
    little = data[1] & 1
    fmt = "<I" if little else ">I"
    (count,) = struct.unpack_from(fmt, data, 4)
    if count < 1:
        raise ValueError("object state message has no layout dimension carrying its stamp")
    (length,) = struct.unpack_from(fmt, data, 8)
    return at.parse_object_state_label(bytes(data[12:12 + max(0, length - 1)]).decode("utf-8", "replace"))


def _peek_stamp(relative_topic: str, data: bytes) -> int | None:
    if relative_topic == at.OBJECT_STATE_TOPIC:
        return cdr_object_state_stamp_ns(data)
    if relative_topic == at.TASK_TOPIC:
        return None
    return cdr_header_stamp_ns(data)


# --- the recorder ---------------------------------------------------------------------------

@dataclass
class RecordResult:
    """Outcome of :meth:`Recorder.stop`."""

    path: Path
    num_steps: int
    success: bool
    episode: Episode | None


def _command_source(data: bytes) -> str:
    """``source`` field of a serialized ArmCommand ("" when unreadable)."""
    from rclpy.serialization import deserialize_message
    try:
        return str(deserialize_message(bytes(data), at.message_class(RECORDED_TOPICS[at.APPLIED_COMMAND_TOPIC])).source)
    except Exception:  # noqa: BLE001 - a malformed message is reported by the conversion
        return ""


def recording_source(declared: str, counts: dict[str, int]) -> str:
    """What drove a recorded episode: the declared source, else the one source of its applied
    commands other than ``hold`` (ticks without a command), else ``mixed:<a>,<b>``."""
    if declared:
        return declared
    driving = sorted(s for s in counts if s and s != "hold")
    if len(driving) == 1:
        return driving[0]
    return "mixed:" + ",".join(driving) if driving else "hold"


def _relative(topic: str) -> str:
    for rel in {**RECORDED_TOPICS, **COMPRESSED_TOPICS}:
        if topic == rel or topic.endswith("/" + rel):
            return rel
    raise ValueError(f"topic {topic!r} is not an arm topic")


class Recorder:
    """Records an arm's topics into one rosbag2/MCAP directory per episode.

    Attach it to a node that spins with a MultiThreadedExecutor (``stop`` waits for the
    last in-flight observations, which needs the subscriptions to keep running).
    ``camera_transport`` "raw" or "compressed" (see :data:`COMPRESSED_TOPICS`); ``image_size``
    (recorded in the bag's metadata) is the side frames are resized to when converted (0: kept).
    """

    def __init__(self, node, output_dir: str | Path, *, namespace: str = "", robot_id: str = "",
                 cameras: bool = True, callback_group=None, camera_transport: str = "raw",
                 image_size: int = 0) -> None:
        from rclpy.callback_groups import ReentrantCallbackGroup
        self.node = node
        self.output_dir = Path(output_dir)
        self.robot_id = robot_id
        self.cameras = cameras
        self.camera_transport, self.image_size = camera_transport, int(image_size)
        self.image_topics = tuple(at.camera_topic(rel, camera_transport) for rel in IMAGE_TOPICS)
        self.topics = at.ArmTopics(namespace)
        self._lock = threading.Condition()
        self._writer: Rosbag2McapWriter | None = None
        self._meta: dict[str, str] = {}
        self._declared_source = ""
        self._latest: dict[str, tuple[bytes, int | None, int]] = {}
        self._applied: set[int] = set()
        self._sources: dict[str, int] = {}  # ArmCommand.source of the applied commands -> count
        self._last_applied_at = 0.0  # monotonic time the newest applied command arrived
        self._seen: dict[str, set[int]] = {}
        self._sequence = 0
        group = callback_group or ReentrantCallbackGroup()
        self._subs = []
        self._qos: dict[str, Any] = {}
        for rel, msgtype in RECORDED_TOPICS.items():
            if rel in IMAGE_TOPICS:
                if not cameras:
                    continue
                rel, msgtype = at.camera_topic(rel, camera_transport), at.CAMERA_MSGTYPES[camera_transport]
            qos = at.qos_for(rel)
            sub = node.create_subscription(
                at.message_class(msgtype), self.topics.name(rel),
                lambda data, rel=rel: self._on_message(rel, data), qos, raw=True,
                callback_group=group)
            self._subs.append(sub)
            self._qos[rel] = (sub.topic_name, msgtype, qos)

    def _resolved_namespace(self) -> str:
        topic = self._qos[at.JOINT_STATES_TOPIC][0]
        return topic[: -len(at.JOINT_STATES_TOPIC)].rstrip("/")

    @property
    def num_applied(self) -> int:
        """Applied commands (steps) received so far in the current episode."""
        with self._lock:
            return len(self._applied)

    @property
    def recording(self) -> bool:
        """Whether an episode is being recorded."""
        return self._writer is not None

    def required_topics(self) -> tuple[str, ...]:
        """Relative topics an episode needs."""
        return STATE_TOPICS + (self.image_topics if self.cameras else ()) + SPINE_TOPICS

    def start(self, task: str, instruction: str = "", variation: str = "default", source: str = "") -> Path:
        """Begin a new episode recording; returns its directory.

        ``source`` names the code driving the arm (``expert:lift_scripted``, ``policy:<sha>``,
        ``teleop``); "" = whatever the applied commands say (their ``source`` fields).
        """
        if not task:
            raise ValueError("Record START needs a task name")
        with self._lock:
            if self._writer is not None:
                raise RuntimeError(f"already recording into {self._writer.directory}")
            self._sequence += 1
            stamp = time.strftime("%Y%m%d-%H%M%S")
            who = re.sub(r"[^A-Za-z0-9_.-]", "_", self.robot_id or "arm")
            name = f"{stamp}_{who}_{re.sub(r'[^A-Za-z0-9_.-]', '_', task)}_{self._sequence:04d}"
            directory = self.output_dir / name
            while directory.exists():
                self._sequence += 1
                directory = self.output_dir / f"{name}_{self._sequence:04d}"
            writer = Rosbag2McapWriter(directory)
            for rel, (topic, msgtype, qos) in self._qos.items():
                writer.add_topic(topic, msgtype, qos)
            self._meta = {"robot_id": self.robot_id, "task": task, "instruction": instruction,
                          "variation": variation or "default",
                          "cameras": "true" if self.cameras else "false",
                          "camera_transport": self.camera_transport, "image_size": str(self.image_size),
                          "arm_namespace": self._resolved_namespace(),
                          "started_at": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
            self._declared_source = source
            self._applied = set()
            self._sources = {}
            self._seen = {rel: set() for rel in self._qos}
            # Pre-roll: the newest sample of every topic, so the observation the arm
            # published just before START (its reset observation) is in the episode, and
            # the latched instruction makes the bag self-contained.
            # Commands are excluded: they belong to the previous episode.
            for rel, (data, stamp, rx_ns) in sorted(self._latest.items(), key=lambda kv: kv[1][2]):
                if rel not in (at.COMMAND_TOPIC, at.APPLIED_COMMAND_TOPIC):
                    self._record(writer, rel, data, stamp, rx_ns)
            self._writer = writer
            return directory

    def _on_message(self, rel: str, data: bytes) -> None:
        now = self.node.get_clock().now().nanoseconds
        try:
            stamp = _peek_stamp(rel, data)
        except (ValueError, struct.error) as exc:
            self.node.get_logger().warning(f"recorder: unreadable message on {rel}: {exc}")
            stamp = None
        with self._lock:
            self._latest[rel] = (bytes(data), stamp, now)
            if self._writer is not None:
                self._record(self._writer, rel, data, stamp, now)
                self._lock.notify_all()

    def _record(self, writer: Rosbag2McapWriter, rel: str, data: bytes, stamp: int | None,
                rx_ns: int) -> None:
        writer.write(self._qos[rel][0], data, rx_ns, stamp or rx_ns)
        if stamp is not None:
            if rel == at.APPLIED_COMMAND_TOPIC:
                self._applied.add(stamp)
                self._last_applied_at = time.monotonic()
                source = _command_source(data)
                self._sources[source] = self._sources.get(source, 0) + 1
            elif rel in self._seen:
                self._seen[rel].add(stamp)

    def _complete(self) -> bool:
        needed = [rel for rel in self.required_topics()
                  if rel in self._seen and rel != at.APPLIED_COMMAND_TOPIC]
        return all(self._applied <= self._seen[rel] for rel in needed)

    def stop(self, success: bool, timeout: float = 1.0, settle: float = 0.25,
             expected_steps: int | None = None, expected_timeout: float = 60.0) -> RecordResult:
        """Finish the episode: close the bag, and convert + cache it when successful.

        ``expected_steps`` (a driver that knows how many steps the arm applied, e.g. from the
        last episode status): wait up to ``expected_timeout`` until that many applied commands
        and all their observations are in, instead of the time-based settle window, so a loaded
        machine records the same steps as an idle one.

        Waits up to ``timeout`` for in-flight messages of the last steps: until every applied
        command's observations arrived and no new applied command came for ``settle`` seconds
        (STOP often follows the arm's last command by less than the DDS delivery time, and
        only waiting for observations of the commands already seen would cut that step off).
        Raises :class:`RecordingError` (after closing the bag) when the recording cannot
        become an episode, e.g. a required topic sent nothing.
        """
        with self._lock:
            if self._writer is None:
                raise RuntimeError("Record STOP without START")
            if expected_steps is not None:
                deadline = time.monotonic() + expected_timeout
                while not (len(self._applied) >= expected_steps and self._complete()):
                    if shutdown.requested():  # Ctrl-C: close with what arrived, wait no longer
                        break
                    if not self._lock.wait(timeout=max(0.0, min(deadline - time.monotonic(), shutdown.POLL_S))):
                        if time.monotonic() >= deadline:
                            break
            deadline = time.monotonic() + (0.0 if expected_steps is not None else timeout)
            while time.monotonic() < deadline:
                quiet_for = time.monotonic() - self._last_applied_at
                if self._complete() and quiet_for >= settle:
                    break
                wait = deadline - time.monotonic()
                if self._complete():
                    wait = min(wait, settle - quiet_for)
                self._lock.wait(timeout=max(0.0, wait))
            writer, self._writer = self._writer, None
            meta = dict(self._meta, success="true" if success else "false",
                        num_applied=str(len(self._applied)),
                        source=recording_source(self._declared_source, self._sources),
                        command_sources=json.dumps(dict(sorted(self._sources.items()))),
                        stopped_at=time.strftime("%Y-%m-%dT%H:%M:%S%z"))
        path = writer.close(meta)
        if not success:
            return RecordResult(path, len(self._applied), False, None)
        # Converting now catches missing topics while the operator is still at the arm,
        # and leaves the episode.npz cache that training reads.
        episode = recording_to_episode(path)
        return RecordResult(path, len(episode), True, episode)

    def discard(self) -> Path | None:
        """Abandon the current episode and delete its directory."""
        with self._lock:
            writer, self._writer = self._writer, None
        if writer is None:
            return None
        writer.abort()
        shutil.rmtree(writer.directory, ignore_errors=True)
        return writer.directory

    def destroy(self) -> None:
        """Discard any open episode and remove the subscriptions."""
        self.discard()
        for sub in self._subs:
            self.node.destroy_subscription(sub)
        self._subs.clear()


def handle_record_request(recorder: Recorder, request, response):
    """Serve a ``fed_ros/srv/Record`` request with ``recorder`` (the robot node's service body)."""
    try:
        if request.command == 0:  # START
            path = recorder.start(request.task, request.instruction, request.variation or "default")
            response.ok, response.episode_path = True, str(path)
            response.message = f"recording {request.task!r} into {path}"
        elif request.command == 1:  # STOP
            result = recorder.stop(bool(request.success))
            response.ok, response.episode_path = True, str(result.path)
            response.num_steps = int(result.num_steps)
            response.message = (f"saved {result.num_steps} steps" if result.success
                                 else "saved as failed (never trained on)")
        elif request.command == 2:  # DISCARD
            path = recorder.discard()
            response.ok = path is not None
            response.message = f"discarded {path}" if path else "nothing was being recorded"
        else:
            response.ok, response.message = False, f"unknown Record command {request.command}"
    except (ValueError, RuntimeError) as exc:
        response.ok, response.message = False, str(exc)
    return response


# --- reading recordings back ---------------------------------------------------------------

def read_recording_metadata(path: str | Path) -> dict[str, Any]:
    """The ``rosbag2_bagfile_information`` of a recording (RecordingError when incomplete)."""
    path = Path(path)
    meta_file = path / METADATA_FILE
    if not meta_file.is_file():
        raise RecordingError(f"{path} is not a finished recording (no {METADATA_FILE})")
    info = yaml.safe_load(meta_file.read_text()) or {}
    try:
        return info["rosbag2_bagfile_information"]
    except (KeyError, TypeError):
        raise RecordingError(f"{meta_file} has no rosbag2_bagfile_information") from None


def _bool(text: str) -> bool:
    return str(text).strip().lower() in ("true", "1", "yes")


def recording_to_episode(path: str | Path, *, allow_failed: bool = False,
                         use_cache: bool = True, max_dropped_fraction: float = 0.1) -> Episode:
    """Convert a recording into an :class:`Episode` (cached as ``episode.npz`` beside it).

    Failed episodes are refused unless ``allow_failed`` (they are never trained on).
    Steps whose observation lost a sample are dropped; more than ``max_dropped_fraction``
    of them, or a required topic without messages, raises :class:`RecordingError`.
    """
    from mcap.reader import make_reader
    from rclpy.serialization import deserialize_message

    path = Path(path)
    info = read_recording_metadata(path)
    custom = {str(k): str(v) for k, v in (info.get("custom_data") or {}).items()}
    success = _bool(custom.get("success", "false"))
    if not success and not allow_failed:
        raise RecordingError(f"recording {path} is marked failed (success=false); "
                             "failed episodes are never trained on")
    cache = path / EPISODE_CACHE
    files = [path / f for f in info.get("relative_file_paths", [])]
    if not files or not all(f.is_file() for f in files):
        raise RecordingError(f"recording {path}: MCAP file(s) {info.get('relative_file_paths')} missing")
    if use_cache and cache.is_file() and cache.stat().st_mtime >= max(f.stat().st_mtime for f in files):
        return Episode.load(cache)

    cameras = _bool(custom.get("cameras", "true"))
    transport, image_size = custom.get("camera_transport", "raw"), int(custom.get("image_size") or 0)
    image_topics = tuple(at.camera_topic(rel, transport) for rel in IMAGE_TOPICS)
    required = STATE_TOPICS + (image_topics if cameras else ()) + SPINE_TOPICS
    counts: dict[str, int] = {}
    full_names: dict[str, str] = {}
    for entry in info.get("topics_with_message_count", []):
        name = entry["topic_metadata"]["name"]
        try:
            rel = _relative(name)
        except ValueError:
            continue
        full_names[rel] = name
        counts[rel] = counts.get(rel, 0) + int(entry.get("message_count", 0))
    namespace = custom.get("arm_namespace", "")
    for rel in required:
        if counts.get(rel, 0) == 0:
            name = full_names.get(rel) or at.ArmTopics(namespace).name(rel)
            state = "has no messages on" if rel in full_names else "does not contain"
            raise RecordingError(f"recording {path} {state} required topic {name!r}")

    by_topic: dict[str, dict[int, Any]] = {rel: {} for rel in required}
    statuses: dict[int, Any] = {}
    for file in files:
        with open(file, "rb") as f:
            for schema, channel, message in make_reader(f).iter_messages():
                try:
                    rel = _relative(channel.topic)
                except ValueError:
                    continue
                if rel not in by_topic:
                    continue
                if rel in image_topics:
                    # Images are decoded only for the steps that are kept (below).
                    stamp = cdr_header_stamp_ns(message.data)
                    by_topic[rel][stamp] = message.data
                    continue
                msg = deserialize_message(message.data, at.message_class(RECORDED_TOPICS[rel]))
                stamp = (at.object_state_stamp_ns(msg) if rel == at.OBJECT_STATE_TOPIC
                         else at.stamp_to_ns(msg.header.stamp))
                if rel == at.EPISODE_STATUS_TOPIC:
                    statuses[stamp] = msg
                by_topic[rel][stamp] = msg

    # The episode is the bridge episode of the last status (the one the recording ended in).
    last_status = statuses[max(statuses)]
    episode_id = int(last_status.episode)
    stamps = sorted(s for s in by_topic[at.APPLIED_COMMAND_TOPIC]
                    if s in statuses and int(statuses[s].episode) == episode_id)
    if not stamps:
        raise RecordingError(f"recording {path}: no applied command of episode {episode_id} "
                             "matches an observation")
    obs_topics = [rel for rel in required if rel not in SPINE_TOPICS]
    kept = [s for s in stamps if all(s in by_topic[rel] for rel in obs_topics)]
    dropped = len(stamps) - len(kept)
    if not kept or dropped > max_dropped_fraction * len(stamps):
        missing = {rel: sum(s not in by_topic[rel] for s in stamps) for rel in obs_topics}
        raise RecordingError(f"recording {path}: {dropped} of {len(stamps)} steps lack "
                             f"observations (missing per topic: {missing})")

    image_type = at.message_class(at.CAMERA_MSGTYPES[transport])
    observations: dict[str, list[np.ndarray]] = {k: [] for k in (
        JOINT_POS, GRIPPER_QPOS, EEF_POS, EEF_QUAT, OBJECT_STATE)}
    if cameras:
        observations.update({AGENTVIEW_IMAGE: [], WRIST_IMAGE: []})
    actions = []
    for s in kept:
        command = by_topic[at.APPLIED_COMMAND_TOPIC][s]
        actions.append(applied_action(command))
        observations[JOINT_POS].append(at.decode_joint_state(by_topic[at.JOINT_STATES_TOPIC][s])[0])
        observations[GRIPPER_QPOS].append(
            at.decode_joint_state(by_topic[at.GRIPPER_STATE_TOPIC][s])[0])
        pos, quat = at.decode_pose(by_topic[at.EEF_POSE_TOPIC][s])
        observations[EEF_POS].append(pos)
        observations[EEF_QUAT].append(quat)
        observations[OBJECT_STATE].append(at.decode_object_state(by_topic[at.OBJECT_STATE_TOPIC][s]))
        if cameras:
            for key, rel in zip((AGENTVIEW_IMAGE, WRIST_IMAGE), image_topics):
                observations[key].append(at.camera_from_msg(
                    deserialize_message(by_topic[rel][s], image_type), transport, image_size))
    episode = Episode(
        task=custom.get("task", ""), instruction=custom.get("instruction", ""),
        observations={k: np.stack(v) for k, v in observations.items()},
        actions=np.stack(actions).astype(np.float32), variation=custom.get("variation", "default"),
        robot_id=custom.get("robot_id", ""), success=success,
        metadata={"recording": str(path), "bridge_episode": str(episode_id),
                  "source": custom.get("source", ""),
                  "dropped_steps": str(dropped), "sim_success": str(bool(last_status.success))})
    if use_cache and success:
        episode.save(cache)
    return episode


def applied_action(command) -> np.ndarray:
    """An applied ArmCommand -> the 4-D action the arm executed."""
    action = np.zeros(ACTION_DIM, dtype=np.float32)
    if int(command.mode) != 3:  # MODE_HOLD records zero motion with the held gripper
        values = np.asarray(command.action, dtype=np.float32)
        if values.shape != (ACTION_DIM - 1,):
            raise RecordingError(f"applied command has {values.size} action values, "
                                 f"expected {ACTION_DIM - 1}")
        action[:3] = values
    action[3] = float(command.gripper)
    return action


def load_recorded_episodes(directory: str | Path, *, include_failed: bool = False) -> list[Episode]:
    """Every finished recording under ``directory`` as episodes (failed ones excluded)."""
    episodes = []
    for meta in sorted(Path(directory).rglob(METADATA_FILE)):
        info = read_recording_metadata(meta.parent)
        if not include_failed and not _bool((info.get("custom_data") or {}).get("success", "false")):
            continue
        episodes.append(recording_to_episode(meta.parent, allow_failed=include_failed))
    return episodes


__all__ = ["Recorder", "RecordResult", "RecordingError", "Rosbag2McapWriter", "applied_action",
           "handle_record_request",
           "load_recorded_episodes", "message_definition", "read_recording_metadata",
           "recording_to_episode", "type_description_hash", "IMAGE_KEYS"]
