"""Arm adapter: the package's arm interface (``arm/...``) on standard ROS 2 arm messages.

Policy side (relative to the robot namespace, what ArmClient and Recorder use, see
:mod:`fed_ros.ros.arm.topics`): observations stamped per tick, ``arm/command`` in,
``arm/applied_command`` / ``arm/episode_status`` out, ``arm/reset`` service, and
``arm/hold`` (std_msgs/Bool: true stops the arm at once, false releases).

Arm side (names from the arm profile, :mod:`fed_ros.core.arm.profile`):

    commands (twist, joints, gripper, home)  -> :mod:`fed_ros.ros.arm.arm_commands`
    sensor_msgs/JointState (all joints)     -> arm/joint_states + arm/gripper_state (profile order)
    geometry_msgs/PoseStamped               -> arm/eef_pose
    cameras (Image / CompressedImage)       -> arm/<camera>/image_raw (rgb8, resized)
    std_msgs/Float32MultiArray (perception) -> arm/object_state (zeros when the profile has none)
    std_msgs/Bool task success              -> EpisodeStatus.success / done

Each tick (``control_rate_hz``) the safety filter (:mod:`fed_ros.core.arm.safety`) turns the
newest policy command into what is sent (clipped, workspace box, watchdog, hold), the
applied command is published stamped with the observation it answered, and the newest
arm state is re-published under one new tick stamp (the synchronisation rule).
"""
from __future__ import annotations

import sys
import threading
import time

import numpy as np
import rclpy
from rclpy.callback_groups import MutuallyExclusiveCallbackGroup, ReentrantCallbackGroup
from rclpy.executors import ExternalShutdownException, MultiThreadedExecutor
from rclpy.node import Node

from fed_ros.core.arm.profile import load_profile, parse_overrides
from fed_ros.core.arm.state import ArmStateStore, observation_from_state
from fed_ros.core.arm.safety import JointSelector, MODE_HOLD, SafetyFilter, TickOutput
from fed_ros.core.arm.ticks import TickSchedule
from fed_ros.core.data.episode import AGENTVIEW_IMAGE, WRIST_IMAGE
from fed_ros.ros import shutdown
from fed_ros.ros.arm import topics as at
from fed_ros.ros.arm.adapter_home import go_home
from fed_ros.ros.arm.arm_commands import ArmCommandOutput
from fed_ros.ros.arm.arm_readiness import missing_arm_topics, subscribe_arm_side
from fed_ros.ros.arm.stop_paths import stop_and_linger
from fed_ros.ros.fleet.params import AdapterParams
from fed_ros.ros.nodes.typed_params import declare_typed_parameters
from fed_ros.ros.wire import diagnostics, qos
from fed_ros.ros.wire.images import decode_camera

_CAMERA_TOPICS = {"agentview": at.AGENTVIEW_TOPIC, "wrist": at.WRIST_TOPIC}
_CAMERA_KEYS = {"agentview": AGENTVIEW_IMAGE, "wrist": WRIST_IMAGE}


class ArmAdapterNode(Node):
    """One arm: fed_ros arm interface on the policy side, standard messages on the arm side."""

    def __init__(self, **kwargs) -> None:
        super().__init__("arm_adapter", **kwargs)
        # Typed, described parameters (AdapterParams); a live `ros2 param set` is applied or refused.
        self.params = p = declare_typed_parameters(self, AdapterParams, self._on_params_changed)
        self.profile = prof = load_profile(p.profile, parse_overrides(p.profile_overrides))
        self.max_steps, self.image_size, self.task, self.lockstep = (p.max_episode_steps, p.image_size, p.task,
                                                                     p.lockstep)
        self.instructions = p.instruction_by_task
        self.cameras = dict(prof.cameras) if p.cameras else {}
        self.safety = SafetyFilter(prof)
        self._joints = JointSelector(prof.joints.names)
        self._fingers = JointSelector(prof.gripper.joint_names)
        # Ticks, commands, stops and the diagnostics snapshot: one at a time.
        self.lock = threading.RLock()
        # Through the module's time (tests drive it with a fake clock).
        self.state = ArmStateStore(p.state_timeout_s, self.lockstep, clock=lambda: time.monotonic())
        self._success = False
        self.episode, self.step, self.done, self.overruns = 0, 0, True, 0
        self._resetting = False
        self._obs_stamp_ns = 0
        self._last_stamp_ns = 0
        self._ticks = TickSchedule(prof.period_s)  # follows the arm's cycle (core.arm_ticks)
        self._stopped = ""  # why the arm was stopped for good (shutdown): nothing moves it again
        self._zeroed_trips = 0  # watchdog trips answered with the full zero
        self._joint_msgs = 0
        self._applied_ns = 0  # observation stamp whose applied command is published
        self._obs_arm_ns = 0  # arm-state (pose) stamp behind the current observation
        self._obs_msgs: list = []  # (publisher, message) of the current observation (lockstep re-send)
        self._obs_at = 0.0

        from fed_ros.msg import ArmCommand, EpisodeStatus
        from fed_ros.srv import ResetEpisode
        from geometry_msgs.msg import PoseStamped
        from sensor_msgs.msg import Image, JointState
        from std_msgs.msg import Bool, Float32MultiArray, String
        self._m = dict(ArmCommand=ArmCommand, EpisodeStatus=EpisodeStatus, String=String)
        io = ReentrantCallbackGroup()
        self._reset_group = MutuallyExclusiveCallbackGroup()  # reset blocks until home is reached

        # --- policy side (the fed_ros arm interface) ---
        def pub(msg_type, rel):
            return self.create_publisher(msg_type, rel, at.qos_for(rel, subscriber=False))
        self._obs_pubs = {at.JOINT_STATES_TOPIC: pub(JointState, at.JOINT_STATES_TOPIC),
                          at.GRIPPER_STATE_TOPIC: pub(JointState, at.GRIPPER_STATE_TOPIC),
                          at.EEF_POSE_TOPIC: pub(PoseStamped, at.EEF_POSE_TOPIC),
                          at.OBJECT_STATE_TOPIC: pub(Float32MultiArray, at.OBJECT_STATE_TOPIC)}
        for cam in self.cameras:
            self._obs_pubs[_CAMERA_TOPICS[cam]] = pub(Image, _CAMERA_TOPICS[cam])
        self._pub_task = pub(String, at.TASK_TOPIC)
        self._pub_applied = pub(ArmCommand, at.APPLIED_COMMAND_TOPIC)
        self._pub_status = pub(EpisodeStatus, at.EPISODE_STATUS_TOPIC)
        self.create_subscription(ArmCommand, at.COMMAND_TOPIC, self._on_command,
                                 at.qos_for(at.COMMAND_TOPIC), callback_group=io)
        # Reliable so an operator's hold is never dropped; volatile to match any publisher.
        self.create_subscription(Bool, "arm/hold", self._on_hold, qos.command_qos(depth=10), callback_group=io)
        self.create_service(ResetEpisode, at.RESET_SERVICE, self._on_reset, callback_group=self._reset_group)

        # --- arm side (standard messages): inputs (arm_readiness), commands (arm_commands) ---
        self._arm_subs = subscribe_arm_side(self.create_subscription, prof, self.cameras, {
            "joint_states": self._on_joint_states, "eef_pose": self._on_pose, "object_state": self._on_object_state,
            "task_success": self._on_success, "camera": self._on_camera}, callback_group=io)
        # Commands (twist, joints, gripper, home): the arm_commands module.
        self.commands = ArmCommandOutput(prof, self.create_publisher, lambda: self.get_clock().now().to_msg())
        self._arm_pubs = self.commands.expected_subscribers()

        # Ticks follow the arm: each end-effector pose (published after the joint states of
        # the same controller cycle) starts one, at most control_rate_hz; the timer keeps
        # the watchdog and the zero twists going when the arm goes quiet.
        self.create_timer(prof.period_s, lambda: self._on_tick(from_timer=True), callback_group=io)
        self.create_timer(p.report_period_s, self._report_missing, callback_group=io)
        diagnostics.attach(self, "adapter", callback_group=io)  # /diagnostics, 1 Hz
        self._pub_task.publish(String(data=self._instruction(self.task)))
        self.get_logger().info(
            f"arm adapter up: profile {prof.name} ({prof.description}), {prof.control_rate_hz:g} Hz, "
            f"twist -> {self.commands.twist.topic_name}, joints {list(prof.joints.names)}, "
            f"1.0 = {prof.limits.max_linear_speed:g} m/s / {prof.limits.max_angular_speed:g} rad/s")
        self._report_missing()

    def _on_params_changed(self, params: AdapterParams) -> None:
        """A live `ros2 param set` (max_episode_steps): the next step is judged against the new cap."""
        with self.lock:
            self.params, self.max_steps = params, params.max_episode_steps
        self.get_logger().info(f"parameters applied: episodes now end after {self.max_steps} steps")

    # ------------------------------------------------------------------ arm state in
    def _put(self, part: str, value: object, stamp_ns: int = 0) -> None:
        with self.lock:
            self.state.put(part, value, stamp_ns)
        if self.lockstep:
            self._lockstep_tick()

    def _on_joint_states(self, msg) -> None:
        try:
            pos, vel = self._joints.select(msg.name, msg.position, msg.velocity)
            fingers = self._fingers.select(msg.name, msg.position, msg.velocity)
        except ValueError as exc:
            self.get_logger().warning(f"{self._arm_subs['joint_states'][0].topic_name}: {exc}",
                                      throttle_duration_sec=5.0)
            return
        with self.lock:
            self._put("fingers", fingers)
            self._put("joints", (pos, vel), at.stamp_to_ns(msg.header.stamp))
            self._joint_msgs += 1

    def _on_pose(self, msg) -> None:
        if msg.header.frame_id and msg.header.frame_id != self.profile.frames.base:
            self.get_logger().warning(f"end-effector pose in frame {msg.header.frame_id!r}, expected "
                                      f"{self.profile.frames.base!r}; ignored", throttle_duration_sec=5.0)
            return
        self._put("pose", at.decode_pose(msg), at.stamp_to_ns(msg.header.stamp))
        if not self.lockstep:
            self._on_tick(from_timer=False)

    def _on_object_state(self, msg) -> None:
        try:
            try:  # a simulator labels its stamp (a perception node publishes none: 0)
                stamp_ns = at.object_state_stamp_ns(msg)
            except ValueError:
                stamp_ns = 0
            self._put("object_state", at.decode_object_state(msg), stamp_ns)
        except ValueError as exc:
            self.get_logger().warning(f"object state: {exc}", throttle_duration_sec=5.0)

    def _on_success(self, msg) -> None:
        with self.lock:
            if not self._resetting:
                self._success = bool(msg.data)

    def _on_camera(self, cam: str, compressed: bool, msg) -> None:
        try:
            self._put(cam, decode_camera(msg, compressed, self.image_size), at.stamp_to_ns(msg.header.stamp))
        except ValueError as exc:
            self.get_logger().warning(f"camera {cam}: {exc}", throttle_duration_sec=5.0)

    def _lockstep_tick(self) -> None:
        """Lockstep: one tick per new arm state, once every part of it is in (same stamp)."""
        with self.lock:
            stamp = self.state.stamp("pose")
            parts = ["joints", *self.cameras] + (["object_state"] if self.profile.topics.object_state else [])
            if stamp == 0 or any(self.state.stamp(k, -1) not in (stamp, 0) for k in parts):
                return  # the rest of this arm cycle is still on its way
            if stamp != self._obs_arm_ns:
                self._on_tick(from_timer=False)
            elif (not self._resetting and self._applied_ns != self._obs_stamp_ns
                  and time.monotonic() - self._obs_at >= 1.0):
                # The arm re-sent the unanswered state: re-send its observation (same stamp),
                # one best-effort sample to the policy may have been lost.
                for pub_, msg in self._obs_msgs:
                    pub_.publish(msg)
                self._obs_at = time.monotonic()

    # ------------------------------------------------------------------ readiness
    def missing(self) -> list[str]:
        """Arm-side topics that are not (yet) there, each with what should provide it."""
        return missing_arm_topics(self._arm_subs, self._arm_pubs, self.count_publishers, self.state,
                                  self.cameras, time.monotonic())

    def _report_missing(self) -> None:
        missing = self.missing()
        if missing:
            self.get_logger().warning(f"waiting for the arm ({self.profile.name}): missing "
                                      + "; ".join(missing))

    # ------------------------------------------------------------------ commands
    def _on_command(self, msg) -> None:
        with self.lock:
            reason = self.safety.command(np.asarray(msg.action), float(msg.gripper), int(msg.mode),
                                         time.monotonic())
        if reason and reason != "hold requested":
            self.get_logger().warning(f"ArmCommand refused ({self.safety.counters.rejected} so far): "
                                      f"{reason}; holding", throttle_duration_sec=1.0)
        if not reason and int(msg.mode) == MODE_HOLD:
            # The policy side stops the arm (its node shutting down, learning switched off):
            # the zero goes at once, whatever observation the HOLD answers.
            with self.lock:
                self._send_zero()
            return
        # A command answering the current observation goes to the arm at once (no wait for
        # the next tick: one tick less latency, as a teleoperated Servo would see it).
        with self.lock:
            if (at.stamp_to_ns(msg.header.stamp) == self._obs_stamp_ns and self._applied_ns != self._obs_stamp_ns
                    and not self.done and not self._resetting):
                self._guarded(self._apply, time.monotonic(), answer=True)

    def _on_hold(self, msg) -> None:
        if msg.data:
            self.stop_arm("e-stop (arm/hold true)")  # at once, not at the next tick
            return
        with self.lock:
            if self._stopped:
                self.get_logger().warning(f"hold release ignored: the arm is stopped for good ({self._stopped})")
                return
            self.safety.hold(False)
        self.get_logger().warning("hold released")

    # ------------------------------------------------------------------ stop paths (arm.stop_paths)
    def stop_arm(self, reason: str, final: bool = False) -> None:
        """Latch the hold and send the arm a zero command now; every stop path ends here.

        The zero is a zero twist, zero joint velocities (the current positions on a position
        interface) and the gripper held at its last commanded position (not the measured one,
        which a grasp holds short of closed: sending it would loosen the grasp). It is sent under
        the lock every tick takes, so no command computed before it can follow it. ``final``
        (shutdown): the latch is never released again, not by a reset nor by ``arm/hold false``.
        """
        with self.lock:
            self.safety.hold(True)
            if final:
                self._stopped = self._stopped or reason
            self._send_zero()
        self.get_logger().warning(f"arm stopped: {reason}; zero command sent")

    def _send_zero(self) -> None:
        """One zero command on every command topic of the arm (caller holds the lock)."""
        joints = self.state.current("joints", time.monotonic())
        self.commands.send_zero(self.safety.last_gripper, None if joints is None else joints[0])

    def policy_publishers(self) -> int:
        """How many nodes publish policy commands to this arm (the robot node while it runs)."""
        return self.count_publishers(self.resolve_topic_name(at.COMMAND_TOPIC))

    def _send(self, out: TickOutput, stamp_ns: int, answer: bool = False) -> None:
        """Publish one tick's arm commands; in lockstep the gripper goes with every answer (held: in place)."""
        gripper = out.gripper if out.gripper is not None or not (answer and self.lockstep) else out.applied_gripper
        joints = self.state.current("joints", time.monotonic()) if out.kind == "joint" else None
        self.commands.send(out, stamp_ns, gripper, None if joints is None else joints[0])

    # ------------------------------------------------------------------ control loop
    def _apply(self, now: float, answer: bool = False) -> None:
        """Send this tick's command through the safety filter and record it as applied."""
        pose = self.state.current("pose", now)
        out = self.safety.tick(now, None if pose is None else pose[0])
        trips = self.safety.watchdog.trips
        if out.reason.startswith("watchdog") and trips != self._zeroed_trips:
            # The policy went silent (its node died): the full zero, once per trip.
            self._zeroed_trips = trips
            self._send_zero()
        # A step needs the arm state of this tick: with a stale state nothing is applied.
        fresh = pose is not None and self.state.current("joints", now) is not None
        active = not self.done and self._obs_stamp_ns > 0 and fresh
        if not active:
            out = TickOutput("hold", applied_gripper=out.applied_gripper, reason="no episode")
        self._send(out, self._obs_arm_ns, answer)
        if active and self._applied_ns != self._obs_stamp_ns:
            self._publish_applied(out)
            self._applied_ns = self._obs_stamp_ns

    def _on_tick(self, from_timer: bool) -> None:
        self._guarded(self._tick, from_timer)

    def _guarded(self, step, *args, **kwargs) -> None:
        """Run one step of the control loop (a tick, or applying a command); any fault stops the arm."""
        try:
            step(*args, **kwargs)
        except Exception as exc:  # noqa: BLE001 - any fault in the control loop stops the arm
            # The hold stays latched until an operator releases it (arm/hold false) or a reset
            # starts the next episode: a loop that failed once is not trusted to move the arm.
            self.get_logger().error(f"control tick failed ({type(exc).__name__}: {exc}): holding")
            self.stop_arm(f"control tick failed: {type(exc).__name__}")

    def _tick(self, from_timer: bool) -> None:
        start = time.monotonic()
        with self.lock:
            if self.lockstep and from_timer:
                return  # a lockstep arm is silent while it waits: only its states make ticks
            if not self.lockstep:
                # The arm drives the ticks, at most control_rate_hz; the timer covers silences.
                if not self._ticks.take(start, from_timer):
                    return
                self.overruns = self._ticks.overruns
            if self._resetting:
                return  # the home trajectory owns the arm
            was_active = not self.done and self._obs_stamp_ns > 0
            if not self.lockstep:  # lockstep: the arm moves only on an answer, nothing to repeat
                self._apply(start)  # repeats the command in effect (what Servo keeps executing)
            before = (self.step, self.done)
            if was_active and self._applied_ns == self._obs_stamp_ns:
                self.step += 1
                self.done = self._success or self.step >= self.max_steps
            if not self._publish_observation(start):
                # A step is an observation and its answer: with a stale state none was taken
                # (counting it anyway skipped step numbers and cut recordings short).
                self.step, self.done = before

    def _publish_applied(self, out: TickOutput) -> None:
        self._pub_applied.publish(at.applied_command_msg(self._m["ArmCommand"](), out, self._obs_stamp_ns,
                                                         self.profile.frames.base))

    def _publish_observation(self, now: float) -> bool:
        """Re-publish the newest arm state under one new tick stamp; False when it is stale."""
        obs = observation_from_state(self.state, now, bool(self.profile.topics.object_state), _CAMERA_KEYS,
                                     self.cameras)
        if obs is None:
            return False
        joint_vel, gripper_vel = obs.pop("_joint_vel"), obs.pop("_gripper_vel")
        stamp_ns = max(self.get_clock().now().nanoseconds, self._last_stamp_ns + 1)
        self._last_stamp_ns = self._obs_stamp_ns = stamp_ns
        self._obs_arm_ns = self.state.stamp("pose")
        messages = at.observation_messages(
            obs, stamp_ns, joint_names=self.profile.joints.names,
            gripper_names=self.profile.gripper.joint_names, joint_vel=joint_vel, gripper_vel=gripper_vel,
            frame_prefix="")
        messages[at.EEF_POSE_TOPIC].header.frame_id = self.profile.frames.base
        self._obs_msgs = [(self._obs_pubs[rel], msg) for rel, msg in messages.items() if rel in self._obs_pubs]
        for pub_, msg in self._obs_msgs:
            pub_.publish(msg)
        status = self._m["EpisodeStatus"]()
        status.header.stamp = at.ns_to_stamp(stamp_ns)
        status.task, status.instruction, status.variation = self.task, self._instruction(self.task), ""
        status.episode, status.step, status.success = self.episode, self.step, self._success
        status.done, status.overruns = self.done, self.overruns
        self._pub_status.publish(status)
        self._obs_msgs.append((self._pub_status, status))
        self._obs_at = time.monotonic()
        return True

    def _instruction(self, task: str) -> str:
        return self.instructions.get(task, task.replace("_", " "))

    def _on_reset(self, request, response):
        """ResetEpisode: send the home trajectory, wait until the arm is there (adapter_home), start an episode."""
        missing = [m for m in self.missing() if "task_success" not in m]
        refusal = (f"the arm adapter has stopped the arm for good ({self._stopped})" if self._stopped
                   else "arm not ready: " + "; ".join(missing) if missing
                   else f"profile {self.profile.name} has no topics.home_trajectory" if self.commands.home is None
                   else "")
        if refusal:
            response.ok, response.message = False, refusal
            self.get_logger().warning(f"reset refused: {refusal}")
            return response
        with self.lock:
            self._resetting, self._success = True, False
            self.safety.hold(True)  # drop the last episode's command; released below

        def joints_now():
            with self.lock:
                joints = self.state.fresh("joints", time.monotonic())
                return (None if joints is None else joints[0]), self._joint_msgs
        failure = go_home(self.commands.send_home, self.profile, joints_now)
        with self.lock:
            self._resetting = False
            if not failure:
                self.task = request.task or self.task
                self.episode += 1
                self.step, self.done, self._success = 0, False, False
                if not self._stopped:  # a shutdown during the home motion keeps its hold
                    self.safety.hold(False)
                self._pub_task.publish(self._m["String"](data=self._instruction(self.task)))
                published = self._publish_observation(time.monotonic())  # the reset observation
        if failure:
            response.ok, response.message = False, failure
            self.get_logger().error(failure)
            return response
        response.ok = published
        response.message = (f"episode {self.episode}: {self.task} at home" if published
                            else "arm state went stale right after reaching home")
        response.instruction, response.episode = self._instruction(self.task), self.episode
        self.get_logger().info(response.message)
        return response


@shutdown.node_main  # ends the process with os._exit after main()'s own teardown
def main(args: list[str] | None = None) -> int | None:
    """Run one arm adapter until Ctrl-C / SIGTERM (``--ros-args -p profile:=ur5e``); 2: bad configuration.

    rclpy's own signal handlers are off (:func:`fed_ros.ros.shutdown.init`): a signal only sets
    a flag, the spin loop sees it and the arm gets its zero command before anything is torn down.
    """
    shutdown.init(args)
    node = None
    executor = MultiThreadedExecutor(num_threads=3)
    try:
        try:
            node = ArmAdapterNode()
        except ValueError as exc:  # a bad parameter or profile, named: no traceback, no arm to stop
            print(f"fed_ros arm adapter: invalid configuration: {exc}", file=sys.stderr)
            return 2
        executor.add_node(node)
        while rclpy.ok() and not shutdown.requested():
            executor.spin_once(timeout_sec=0.1)
        if rclpy.ok():
            stop_and_linger(node, lambda timeout: executor.spin_once(timeout_sec=timeout))
    except (KeyboardInterrupt, ExternalShutdownException):
        pass
    finally:
        executor.shutdown()
        if node is not None:
            node.destroy_node()
        rclpy.try_shutdown()


if __name__ == "__main__":
    main()
