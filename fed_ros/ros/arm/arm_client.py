"""Driving an arm over ROS: :class:`ArmClient` (reset, observe, command, run an episode; the
evaluation of a policy through a bridge built on it is :mod:`fed_ros.ros.arm.policy_evaluation`).

A policy (``reset()`` / ``act(obs) -> (4,)``, e.g. a ``PolicyRunner`` or a scripted
expert) sees the same observation dict as in-process, assembled from one control tick's
messages (matching stamps), plus ``"instruction"``. Each command is stamped with the
observation it answers, so a lockstep bridge reproduces in-process rollouts exactly.
"""

from __future__ import annotations

import queue
import threading
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from fed_ros.core.arm.safety import MODE_HOLD
from fed_ros.core.data.episode import AGENTVIEW_IMAGE, OBJECT_STATE, WRIST_IMAGE
from fed_ros.ros import shutdown
from fed_ros.ros.arm import topics as at
from fed_ros.ros.arm.interventions import HandoverWatch
from fed_ros.ros.arm.observation_assembly import ObservationAssembler

STATUS_PART = "status"


class EpisodeInterrupted(Exception):
    """The episode was stopped before it ended (:meth:`ArmClient.halt`: learning switched off,
    the node shutting down); the arm was sent a HOLD after the policy's last command."""


@dataclass
class EpisodeOutcome:
    """What one episode driven over ROS ended with."""

    episode: int
    success: bool
    steps: int
    overruns: int
    timed_out: bool = False
    interventions: int = 0  # human takeovers in the episode (the adapter's count)
    human_seconds: float = 0.0  # seconds a human drove the arm in the episode


class ArmClient:
    """Client side of one arm's topics, attached to a node spun by another thread.

    ``camera_transport`` "raw" (sensor_msgs/Image) or "compressed" (CompressedImage on
    ``.../image_raw/compressed``); frames are resized to ``image_size`` (0: as they came).
    """

    def __init__(
        self,
        node,
        namespace: str = "",
        cameras: bool = True,
        source: str = "policy",
        callback_group=None,
        camera_transport: str = "raw",
        image_size: int = 0,
    ) -> None:
        from fed_ros.msg import ArmCommand, EpisodeStatus
        from fed_ros.srv import ResetEpisode
        from geometry_msgs.msg import PoseStamped
        from rclpy.callback_groups import ReentrantCallbackGroup
        from sensor_msgs.msg import CompressedImage, Image, JointState
        from std_msgs.msg import Float32MultiArray, String

        self.node = node
        self.topics = at.ArmTopics(namespace)
        self.cameras = cameras
        self.camera_topics = [
            at.camera_topic(rel, camera_transport) for rel in (at.AGENTVIEW_TOPIC, at.WRIST_TOPIC)
        ]
        self.source = source
        self._ArmCommand = ArmCommand
        self._ResetRequest = ResetEpisode.Request
        group = callback_group or ReentrantCallbackGroup()
        self._lock = threading.Lock()
        # Commands and halts are published under this lock: once halt() returned, no policy
        # command can follow its HOLD onto the wire (a policy thread mid-act() included).
        self._send_lock = threading.Lock()
        self.halted = ""  # why this client stopped driving the arm ("" while it may drive)
        self.commands_sent = 0
        self._assembler = ObservationAssembler(cameras=cameras)
        self._assembler.required.add(STATUS_PART)
        self._observations: queue.Queue = queue.Queue()
        self.observed = threading.Event()  # a complete observation arrived (the arm reports)
        self.instruction = ""

        def sub(msg_type, rel, part, decode):
            def callback(msg):
                try:
                    stamp, value = decode(msg)
                except ValueError as exc:
                    self.node.get_logger().warning(f"bad message on {rel}: {exc}")
                    return
                self._add(part, stamp, value)

            return node.create_subscription(
                msg_type, self.topics.name(rel), callback, at.qos_for(rel), callback_group=group
            )

        def stamped(decode):
            return lambda msg: (at.stamp_to_ns(msg.header.stamp), decode(msg))

        self._subs = [
            sub(JointState, at.JOINT_STATES_TOPIC, "joint_states", stamped(at.decode_joint_state)),
            sub(
                JointState, at.GRIPPER_STATE_TOPIC, "gripper_state", stamped(at.decode_joint_state)
            ),
            sub(PoseStamped, at.EEF_POSE_TOPIC, "eef_pose", stamped(at.decode_pose)),
            sub(
                Float32MultiArray,
                at.OBJECT_STATE_TOPIC,
                OBJECT_STATE,
                lambda m: (at.object_state_stamp_ns(m), at.decode_object_state(m)),
            ),
            sub(EpisodeStatus, at.EPISODE_STATUS_TOPIC, STATUS_PART, stamped(lambda m: m)),
        ]
        if cameras:
            image_type = CompressedImage if camera_transport == "compressed" else Image
            frame = stamped(lambda m: at.camera_from_msg(m, camera_transport, image_size))
            self._subs += [
                sub(image_type, rel, key, frame)
                for key, rel in zip((AGENTVIEW_IMAGE, WRIST_IMAGE), self.camera_topics)
            ]
        self._subs.append(
            node.create_subscription(
                String,
                self.topics.task,
                self._on_task,
                at.qos_for(at.TASK_TOPIC),
                callback_group=group,
            )
        )
        self._command_pub = node.create_publisher(
            ArmCommand, self.topics.command, at.qos_for(at.COMMAND_TOPIC, subscriber=False)
        )
        self._reset_client = node.create_client(
            ResetEpisode, self.topics.reset, callback_group=group
        )

    def _on_task(self, msg) -> None:
        self.instruction = msg.data

    def _add(self, part: str, stamp_ns: int, value: Any) -> None:
        with self._lock:
            obs = self._assembler.add(part, stamp_ns, value)
        if obs is not None:
            self._observations.put((stamp_ns, obs))
            self.observed.set()

    # ------------------------------------------------------------------ arm operations
    def wait_for_arm(self, timeout: float = 30.0) -> None:
        """Block until the arm's reset service and observation streams are discovered."""
        deadline = time.monotonic() + timeout
        # Every wait here (and in reset / next_observation) gives up on Ctrl-C:
        # fed_ros.ros.shutdown.
        if not shutdown.wait_for_service(self._reset_client, timeout):
            raise TimeoutError(f"no arm reset service {self.topics.reset!r} after {timeout:.0f} s")
        names = [self.topics.joint_states, self.topics.episode_status, self.topics.object_state]
        if self.cameras:
            names += [self.topics.name(rel) for rel in self.camera_topics]
        for name in names:
            while self.node.count_publishers(name) == 0:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"no publisher on arm topic {name!r} after {timeout:.0f} s")
                shutdown.sleep(0.05)
        # Subscriptions match a publisher slightly after the graph shows it.
        while self._command_pub.get_subscription_count() == 0:
            if time.monotonic() > deadline:
                raise TimeoutError(f"arm does not subscribe to {self.topics.command!r}")
            shutdown.sleep(0.05)
        # An arm adapter offers these topics before its arm reports (MuJoCo still loading, a
        # driver not up): ready means one complete observation arrived.
        while not self.observed.is_set():
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"no complete observation on {self.topics.episode_status!r} after "
                    f"{timeout:.0f} s (is the arm reporting? see the adapter's log)"
                )
            shutdown.sleep(0.05)

    def reset(
        self, task: str = "", variation: str = "", seed: int = -1, timeout: float = 60.0
    ) -> tuple[str, int]:
        """Call the arm's reset service; returns (instruction, episode number).

        Raises :class:`EpisodeInterrupted` while halted (no new episode starts).
        """
        if self.halted:
            raise EpisodeInterrupted(f"no reset: {self.halted}")
        request = self._ResetRequest(task=task, variation=variation, seed=int(seed))
        from fed_ros.ros.wire.service_calls import call_service

        response = call_service(self._reset_client, request, timeout)
        if response is None:
            raise TimeoutError(f"arm reset {self.topics.reset!r} did not answer in {timeout:.0f} s")
        if not response.ok:
            raise RuntimeError(f"arm reset refused: {response.message}")
        self.instruction = response.instruction
        return response.instruction, int(response.episode)

    def send(
        self, action: np.ndarray, stamp_ns: int, mode: int = 0, source: str | None = None
    ) -> None:
        """Publish an ArmCommand answering the observation stamped ``stamp_ns``.

        ``source`` says which code produced the command (default: this client's ``source``).
        """
        action = np.asarray(action, dtype=np.float32).reshape(-1)
        msg = self._ArmCommand()
        msg.header.stamp = at.ns_to_stamp(stamp_ns)
        msg.action = action[:3].tolist()
        msg.gripper = float(action[3]) if action.size > 3 else 0.0
        msg.mode = int(mode)
        msg.source = self.source if source is None else source
        with self._send_lock:
            if self.halted:
                return  # halted: the HOLD already sent stays the last command
            self._command_pub.publish(msg)
            self.commands_sent += 1

    def halt(self, reason: str, ack_timeout_s: float = 1.0) -> bool:
        """Stop driving the arm: send a HOLD after every command this client sent, and drop any
        later command until :meth:`resume`. A running :meth:`run_episode` raises
        :class:`EpisodeInterrupted` at its next step. Returns whether a HOLD was sent (only when
        this client has commanded the arm: an idle arm is already held by its adapter).
        """
        from rclpy.duration import Duration

        with self._send_lock:
            already = bool(self.halted)
            self.halted = reason
            if already or self.commands_sent == 0:
                return False
            msg = self._ArmCommand()
            msg.mode, msg.action, msg.gripper = MODE_HOLD, [0.0, 0.0, 0.0], 0.0
            msg.source = f"halt: {reason}"
            msg.header.stamp = at.ns_to_stamp(0)
            self._command_pub.publish(msg)
        # Reliable: wait until the arm side has it (a node about to exit must not lose it).
        self._command_pub.wait_for_all_acked(Duration(seconds=ack_timeout_s))
        return True

    def resume(self) -> None:
        """Allow commands again after :meth:`halt` (learning switched back on)."""
        with self._send_lock:
            self.halted = ""
            self.commands_sent = 0

    def run_episode(
        self,
        policy,
        episode: int,
        timeout: float = 120.0,
        max_steps: int | None = None,
        source: str | None = None,
        handover: Any = None,
    ) -> EpisodeOutcome:
        """Drive ``policy`` on the arm's current episode until it reports done.

        Every command carries ``source`` (default: the policy's own ``source`` attribute,
        e.g. ``expert:lift_scripted``, else this client's), which the arm copies into its
        applied commands, so a recording says which code drove each step.

        Always acts on the newest complete observation (a slow policy skips ticks rather
        than lagging behind them). The action is clipped to [-1, 1] like the in-process
        path; a non-finite action is sent as is and the arm rejects it. While a human drives
        the arm (EpisodeStatus.human_control) the policy does not act; ``handover`` (hooks with
        ``takeover(status)`` / ``handback(status)``, :mod:`fed_ros.ros.arm.interventions`) is
        told of each change.
        """
        policy.reset()
        if source is None:
            source = getattr(policy, "source", None) or self.source
        deadline = time.monotonic() + timeout
        steps = overruns = 0
        watch, status = HandoverWatch(handover), None
        while True:
            if self.halted:
                raise EpisodeInterrupted(
                    f"episode {episode} stopped at step {steps}: {self.halted}"
                )
            remaining = deadline - time.monotonic()
            try:
                stamp_ns, obs, status = self.next_observation(episode, max(remaining, 0.0))
            except TimeoutError:
                watch.end(status)
                return EpisodeOutcome(episode, False, steps, overruns, True, *_human(status))
            steps, overruns = int(status.step), int(status.overruns)
            if status.done or (max_steps is not None and steps >= max_steps):
                watch.end(status)
                return EpisodeOutcome(
                    episode, bool(status.success), steps, overruns, False, *_human(status)
                )
            if watch.update(status):
                continue  # a human drives: the adapter would drop the policy's command
            obs["instruction"] = self.instruction
            action = np.asarray(policy.act(obs), dtype=np.float32)
            if action.shape == (4,) and np.all(np.isfinite(action)):
                action = np.clip(action, -1.0, 1.0)
            self.send(action, stamp_ns, source=source)

    def next_observation(
        self, episode: int, timeout: float = 10.0
    ) -> tuple[int, dict[str, Any], Any]:
        """Newest complete observation of ``episode``: (stamp ns, obs dict, EpisodeStatus).

        Older queued observations are skipped (a slow consumer acts on the latest tick).
        """
        deadline = time.monotonic() + timeout
        while True:
            shutdown.check()
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(f"no observation of episode {episode} in {timeout:.1f} s")
            try:
                items = [self._observations.get(timeout=min(remaining, 0.5))]
            except queue.Empty:
                continue
            while True:
                try:
                    items.append(self._observations.get_nowait())
                except queue.Empty:
                    break
            current = [(s, o) for s, o in items if int(o[STATUS_PART].episode) == episode]
            if current:
                stamp_ns, obs = current[-1]
                return stamp_ns, obs, obs.pop(STATUS_PART)

    def destroy(self) -> None:
        """Remove this client's subscriptions, publisher and service client."""
        for sub in self._subs:
            self.node.destroy_subscription(sub)
        self.node.destroy_publisher(self._command_pub)
        self.node.destroy_client(self._reset_client)


def _human(status: Any) -> tuple[int, float]:
    """(takeovers, human seconds) an EpisodeStatus reports for its episode so far."""
    if status is None:
        return 0, 0.0
    return int(status.interventions), float(status.human_seconds)
