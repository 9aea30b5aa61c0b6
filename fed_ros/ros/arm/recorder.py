"""Demonstration recording: an arm's topics -> MCAP in rosbag2 layout -> :class:`Episode`.

:class:`Recorder` subscribes to an arm's topics (raw CDR, see
:mod:`fed_ros.ros.arm.recording_topics`) and writes one rosbag2/MCAP directory per episode
(:mod:`fed_ros.ros.arm.rosbag2_mcap`); a successful one is converted to an :class:`Episode`
right away (:mod:`fed_ros.ros.arm.recorded_episodes`, which also loads recordings from disk).
``handle_record_request`` serves ``fed_ros/srv/Record`` with a recorder.
"""

from __future__ import annotations

import json
import re
import shutil
import struct
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fed_ros.core.arm.interventions import INTERVENTION_SOURCE
from fed_ros.core.data.episode import Episode
from fed_ros.core.data.quarantine import QUARANTINE_DIR, quarantine
from fed_ros.ros import shutdown
from fed_ros.ros.arm import topics as at
from fed_ros.ros.arm.recorded_episodes import RecordingError, recording_to_episode
from fed_ros.ros.arm.recording_topics import (
    IMAGE_TOPICS,
    RECORDED_TOPICS,
    SPINE_TOPICS,
    STATE_TOPICS,
    peek_human_control,
    peek_stamp,
)
from fed_ros.ros.arm.rosbag2_mcap import Rosbag2McapWriter


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
        return str(
            deserialize_message(
                bytes(data), at.message_class(RECORDED_TOPICS[at.APPLIED_COMMAND_TOPIC])
            ).source
        )
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


class Recorder:
    """Records an arm's topics into one rosbag2/MCAP directory per episode.

    Attach it to a node that spins with a MultiThreadedExecutor (``stop`` waits for the
    last in-flight observations, which needs the subscriptions to keep running).
    ``camera_transport`` "raw" or "compressed" (see :data:`COMPRESSED_TOPICS`); ``image_size``
    (recorded in the bag's metadata) is the side frames are resized to when converted (0: kept).
    """

    def __init__(
        self,
        node,
        output_dir: str | Path,
        *,
        namespace: str = "",
        robot_id: str = "",
        cameras: bool = True,
        callback_group=None,
        camera_transport: str = "raw",
        image_size: int = 0,
    ) -> None:
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
        # A human's corrective segment ends at the hand-back: the first observation whose
        # status says the policy drives again; nothing stamped from then on is recorded.
        self._ends_at_handback = False
        self._human_seen = False
        self._end_ns: int | None = None
        self._sequence = 0
        group = callback_group or ReentrantCallbackGroup()
        self._subs = []
        self._qos: dict[str, Any] = {}
        for rel, msgtype in RECORDED_TOPICS.items():
            if rel in IMAGE_TOPICS:
                if not cameras:
                    continue
                rel, msgtype = (
                    at.camera_topic(rel, camera_transport),
                    at.CAMERA_MSGTYPES[camera_transport],
                )
            qos = at.qos_for(rel, recorder=True)
            sub = node.create_subscription(
                at.message_class(msgtype),
                self.topics.name(rel),
                lambda data, rel=rel: self._on_message(rel, data),
                qos,
                raw=True,
                callback_group=group,
            )
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

    def start(
        self, task: str, instruction: str = "", variation: str = "default", source: str = ""
    ) -> Path:
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
            self._meta = {
                "robot_id": self.robot_id,
                "task": task,
                "instruction": instruction,
                "variation": variation or "default",
                "cameras": "true" if self.cameras else "false",
                "camera_transport": self.camera_transport,
                "image_size": str(self.image_size),
                "arm_namespace": self._resolved_namespace(),
                "started_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            }
            self._declared_source = source
            self._applied = set()
            self._sources = {}
            self._seen = {rel: set() for rel in self._qos}
            self._ends_at_handback = source == INTERVENTION_SOURCE
            self._human_seen, self._end_ns = False, None
            # Pre-roll: the newest sample of every topic, so the observation the arm
            # published just before START (its reset observation) is in the episode, and
            # the latched instruction makes the bag self-contained.
            # Commands are excluded: they belong to the previous episode.
            for rel, (data, stamp, rx_ns) in sorted(self._latest.items(), key=lambda kv: kv[1][2]):
                if rel not in (at.COMMAND_TOPIC, at.APPLIED_COMMAND_TOPIC):
                    if self._keeps(rel, data, stamp):
                        self._record(writer, rel, data, stamp, rx_ns)
            self._writer = writer
            return directory

    def _on_message(self, rel: str, data: bytes) -> None:
        now = self.node.get_clock().now().nanoseconds
        try:
            stamp = peek_stamp(rel, data)
        except (ValueError, struct.error) as exc:
            self.node.get_logger().warning(f"recorder: unreadable message on {rel}: {exc}")
            stamp = None
        with self._lock:
            self._latest[rel] = (bytes(data), stamp, now)
            if self._writer is not None and self._keeps(rel, data, stamp):
                self._record(self._writer, rel, data, stamp, now)
                self._lock.notify_all()

    def _keeps(self, rel: str, data: bytes, stamp: int | None) -> bool:
        """Whether a message belongs to the episode being recorded (caller holds the lock)."""
        if stamp is None:
            return True
        if self._ends_at_handback and self._end_ns is None and rel == at.EPISODE_STATUS_TOPIC:
            if peek_human_control(data):
                self._human_seen = True
            elif self._human_seen:  # the hand-back: the policy answers this observation
                self._end_ns = stamp
        return self._end_ns is None or stamp < self._end_ns

    def _record(
        self, writer: Rosbag2McapWriter, rel: str, data: bytes, stamp: int | None, rx_ns: int
    ) -> None:
        writer.write(self._qos[rel][0], data, rx_ns, stamp or rx_ns)
        if stamp is not None:
            if rel == at.APPLIED_COMMAND_TOPIC:
                self._applied.add(stamp)
                self._last_applied_at = time.monotonic()
                source = _command_source(data)
                self._sources[source] = self._sources.get(source, 0) + 1
            elif rel in self._seen:
                self._seen[rel].add(stamp)

    def end_at(self, stamp_ns: int) -> None:
        """End the episode before the observation stamped ``stamp_ns``: nothing stamped from it
        on is recorded (a hand-back: the next driver answers that observation)."""
        with self._lock:
            if self._end_ns is None or stamp_ns < self._end_ns:
                self._end_ns = int(stamp_ns)

    def _last_step_in(self) -> bool:
        """Whether the newest recorded observation's applied command, and every applied
        command's observations, are in (caller holds the lock)."""
        statuses = self._seen.get(at.EPISODE_STATUS_TOPIC) or set()
        return self._complete() and (not statuses or max(statuses) in self._applied)

    def _complete(self) -> bool:
        needed = [
            rel
            for rel in self.required_topics()
            if rel in self._seen and rel != at.APPLIED_COMMAND_TOPIC
        ]
        return all(self._applied <= self._seen[rel] for rel in needed)

    def stop(
        self,
        success: bool,
        timeout: float = 1.0,
        settle: float = 0.25,
        expected_steps: int | None = None,
        expected_timeout: float = 60.0,
        end_stamp_ns: int | None = None,
    ) -> RecordResult:
        """Finish the episode: close the bag, and convert + cache it when successful.

        ``expected_steps`` (a driver that knows how many steps the arm applied, e.g. from the
        last episode status): wait up to ``expected_timeout`` until that many applied commands
        and all their observations are in, instead of the time-based settle window, so a loaded
        machine records the same steps as an idle one.

        Waits up to ``timeout`` for in-flight messages of the last steps: until every applied
        command's observations arrived and no new applied command came for ``settle`` seconds
        (STOP often follows the arm's last command by less than the DDS delivery time, and
        only waiting for observations of the commands already seen would cut that step off).
        ``end_stamp_ns`` (a hand-back, :mod:`fed_ros.ros.arm.interventions`): the episode
        ends before the observation stamped so; nothing from it on is recorded, and the wait
        (at most ``timeout``) is only for the last earlier step, with no settle window (the
        arm goes on applying commands, the next driver's).

        Raises :class:`RecordingError` (after closing the bag) when the recording cannot
        become an episode, e.g. a required topic sent nothing.
        """
        with self._lock:
            if self._writer is None:
                raise RuntimeError("Record STOP without START")
            if end_stamp_ns is not None:
                self.end_at(end_stamp_ns)
            if self._end_ns is not None:
                deadline = time.monotonic() + timeout
                while not self._last_step_in() and time.monotonic() < deadline:
                    self._lock.wait(timeout=max(0.0, deadline - time.monotonic()))
                timeout = 0.0  # no settle window below
            if expected_steps is not None:
                deadline = time.monotonic() + expected_timeout
                while not (len(self._applied) >= expected_steps and self._complete()):
                    if shutdown.requested():  # Ctrl-C: close with what arrived, wait no longer
                        break
                    if not self._lock.wait(
                        timeout=max(0.0, min(deadline - time.monotonic(), shutdown.POLL_S))
                    ):
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
            meta = dict(
                self._meta,
                success="true" if success else "false",
                num_applied=str(len(self._applied)),
                source=recording_source(self._declared_source, self._sources),
                command_sources=json.dumps(dict(sorted(self._sources.items()))),
                stopped_at=time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            )
        path = writer.close(meta)
        if not success:
            return RecordResult(path, len(self._applied), False, None)
        # Converting now catches missing topics while the operator is still at the arm,
        # and leaves the episode.npz cache that training reads.
        try:
            episode = recording_to_episode(path)
        except Exception as exc:  # noqa: BLE001 - whatever the conversion raises, the bag goes
            # A refused bag left among the demonstrations, labelled a success, would fail every
            # later load (each STOP, each round's training): it leaves with its reason.
            where = quarantine(path, f"{type(exc).__name__}: {exc}", self.output_dir)
            where = where or self.output_dir / QUARANTINE_DIR  # a concurrent load moved it first
            self.node.get_logger().warning(f"recording refused, quarantined in {where}: {exc}")
            raise RecordingError(f"{exc}; the recording was moved to {where}") from exc
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
            response.message = (
                f"saved {result.num_steps} steps"
                if result.success
                else "saved as failed (never trained on)"
            )
        elif request.command == 2:  # DISCARD
            path = recorder.discard()
            response.ok = path is not None
            response.message = f"discarded {path}" if path else "nothing was being recorded"
        else:
            response.ok, response.message = False, f"unknown Record command {request.command}"
    except (ValueError, RuntimeError) as exc:
        response.ok, response.message = False, str(exc)
    return response


__all__ = ["Recorder", "RecordResult", "handle_record_request", "recording_source"]
