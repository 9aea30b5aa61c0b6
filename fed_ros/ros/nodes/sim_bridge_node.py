"""MuJoCo arm behind the same ROS 2 interface a real arm driver offers.

Each control tick (fixed-rate timer, ``control_rate_hz``) applies the latest valid
``arm/command`` (or holds still when there is none, it is older than
``command_timeout_s``, or the last one was rejected), steps the simulator and publishes
the new observation: camera images, joint and gripper states, end-effector pose and
object state, all with the tick's stamp, then ``arm/episode_status``. Before stepping it
publishes ``arm/applied_command`` stamped with the observation the action was applied
to, which is what recordings are built from (see :mod:`fed_ros.ros.arm.topics`).

``lockstep:=true`` (evaluation, benchmarks) steps only when a command answering the
current observation arrives (its ``header.stamp`` equals the observation's), so a run is
exactly reproducible whatever the machine load; the control rate is then ignored. With
``interface:=ros2_control`` the step waits for the TwistStamped stamped with the latest
state's stamp (plus its gripper command), and the state is re-sent at the control rate.
"""
from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass

os.environ.setdefault("MUJOCO_GL", "egl")

import numpy as np  # noqa: E402
import rclpy  # noqa: E402
from rclpy.executors import ExternalShutdownException, SingleThreadedExecutor  # noqa: E402
from rclpy.node import Node  # noqa: E402

from fed_ros.core.data.episode import ACTION_DIM
from fed_ros.ros import shutdown  # noqa: E402
from fed_ros.ros.arm import topics as at  # noqa: E402
from fed_ros.ros.fleet.params import BridgeParams  # noqa: E402
from fed_ros.ros.nodes.typed_params import declare_typed_parameters  # noqa: E402

MODE_OSC_POSITION = 0
MODE_OSC_POSE = 1
MODE_JOINT_VELOCITY = 2
MODE_HOLD = 3
_MODE_NAMES = {MODE_OSC_POSITION: "OSC_POSITION", MODE_OSC_POSE: "OSC_POSE",
               MODE_JOINT_VELOCITY: "JOINT_VELOCITY", MODE_HOLD: "HOLD"}


@dataclass(frozen=True)
class ValidCommand:
    """A command that passed validation: ``hold`` or an OSC position action."""

    action: np.ndarray  # (3,) float32, ignored when hold
    gripper: float
    hold: bool
    stamp_ns: int
    source: str


def validate_command(msg) -> ValidCommand:
    """Check an ArmCommand for this arm (OSC position, 4-D); ValueError names the problem."""
    mode = int(msg.mode)
    if mode not in (MODE_OSC_POSITION, MODE_HOLD):
        name = _MODE_NAMES.get(mode, "unknown")
        raise ValueError(f"mode {mode} ({name}) is not supported by this arm "
                         f"(supported: {MODE_OSC_POSITION} OSC_POSITION, {MODE_HOLD} HOLD)")
    gripper = float(msg.gripper)
    if not np.isfinite(gripper) or not -1.0 <= gripper <= 1.0:
        raise ValueError(f"gripper {gripper!r} is not a finite value in [-1, 1]")
    action = np.asarray(msg.action, dtype=np.float32)
    stamp_ns = at.stamp_to_ns(msg.header.stamp)
    if mode == MODE_HOLD:
        return ValidCommand(np.zeros(ACTION_DIM - 1, np.float32), gripper, True, stamp_ns, msg.source)
    if action.shape != (ACTION_DIM - 1,):
        raise ValueError(f"action has {action.size} values, expected {ACTION_DIM - 1} "
                         "(OSC position dx, dy, dz)")
    if not np.all(np.isfinite(action)):
        raise ValueError(f"action contains NaN/Inf: {action.tolist()}")
    if np.any(np.abs(action) > 1.0):
        raise ValueError(f"action {action.tolist()} is outside [-1, 1]")
    return ValidCommand(action, gripper, False, stamp_ns, msg.source)


class SimBridgeNode(Node):
    """One simulated Panda arm: publishes observations, applies commands, resets episodes."""

    def __init__(self, **kwargs) -> None:
        super().__init__("sim_bridge", **kwargs)
        # Typed, described parameters (BridgeParams); a live `ros2 param set` is applied or refused.
        self.params = p = declare_typed_parameters(self, BridgeParams, self._on_params_changed)
        self.task, self.variation, self.cameras, self.image_size = p.task, p.variation, p.cameras, p.image_size
        self.rate_hz, self.seed, self.lockstep, self.republish_s = (p.control_rate_hz, p.seed, p.lockstep,
                                                                    p.lockstep_republish_s)
        self.command_timeout_ns = int(p.command_timeout_s * 1e9)
        self.horizon, self.frame_prefix, self.interface = p.horizon, p.frame_prefix, p.interface
        self._standard = None

        def pub(msg_type, rel):
            if self._standard is not None:
                return None  # ros2_control interface: none of the fed_ros arm topics
            return self.create_publisher(msg_type, rel, at.qos_for(rel, subscriber=False))

        from fed_ros.msg import ArmCommand, EpisodeStatus
        from fed_ros.srv import ResetEpisode
        from geometry_msgs.msg import PoseStamped
        from sensor_msgs.msg import Image, JointState
        from std_msgs.msg import Float32MultiArray, String
        self._ArmCommand, self._EpisodeStatus = ArmCommand, EpisodeStatus
        if self.interface == "ros2_control":
            # No fed_ros message on this node: the arm adapter talks to it like to a real arm.
            from fed_ros.core.arm.profile import load_profile, parse_overrides
            from fed_ros.ros.arm.ros2_control_sim import Ros2ControlSim
            profile = load_profile(p.profile, parse_overrides(p.profile_overrides))
            # Lockstep: a step per twist answering the latest state (ros2_control_sim docstring).
            self._standard = Ros2ControlSim(self, profile, self.command_timeout_ns,
                                            on_home=lambda: self._reset(self.seed + self.episode),
                                            on_answer=self._on_answer if self.lockstep else None)
        # Observation topics, published in this order each tick (images first: largest).
        self._publishers_by_topic = {}
        if self.cameras:
            self._publishers_by_topic[at.AGENTVIEW_TOPIC] = pub(Image, at.AGENTVIEW_TOPIC)
            self._publishers_by_topic[at.WRIST_TOPIC] = pub(Image, at.WRIST_TOPIC)
        self._publishers_by_topic[at.JOINT_STATES_TOPIC] = pub(JointState, at.JOINT_STATES_TOPIC)
        self._publishers_by_topic[at.GRIPPER_STATE_TOPIC] = pub(JointState, at.GRIPPER_STATE_TOPIC)
        self._publishers_by_topic[at.EEF_POSE_TOPIC] = pub(PoseStamped, at.EEF_POSE_TOPIC)
        self._publishers_by_topic[at.OBJECT_STATE_TOPIC] = pub(Float32MultiArray, at.OBJECT_STATE_TOPIC)
        self._pub_task = pub(String, at.TASK_TOPIC)
        self._String = String
        self._pub_applied = pub(ArmCommand, at.APPLIED_COMMAND_TOPIC)
        self._pub_status = pub(EpisodeStatus, at.EPISODE_STATUS_TOPIC)
        if self._standard is None:
            self.create_subscription(ArmCommand, at.COMMAND_TOPIC, self._on_command,
                                     at.qos_for(at.COMMAND_TOPIC))
            self.create_service(ResetEpisode, at.RESET_SERVICE, self._on_reset)

        self.env = None
        self.episode = 0
        self.step_index = 0
        self.done = True
        self.success = False
        self.overruns = 0
        self.rejected = 0
        self.steps_total = 0
        self._command: ValidCommand | None = None
        self._command_rx_ns = 0
        self._held_gripper = -1.0  # robosuite resets with the gripper open
        self._obs: dict[str, np.ndarray] | None = None
        self._obs_stamp_ns = 0
        self._last_stamp_ns = 0
        self._last_tick: float | None = None
        self._period = 1.0 / self.rate_hz
        self._joint_qvel = self._grip_qvel = None
        self._last_published: list[tuple[object, object]] = []  # (publisher, message) of the current tick
        self._published_at = 0.0

        self._build_env(self.task, self.variation)
        self._reset(self.seed)
        self._timer = None if self.lockstep else self.create_timer(self._period, self._on_tick)
        if self.lockstep and self.republish_s > 0 and self._standard is None:
            self.create_timer(self.republish_s / 2, self._republish_if_unanswered)
        if self.lockstep and self._standard is not None:  # a standing arm keeps reporting its state
            self.create_timer(self._period, self._standard.republish)
        self.get_logger().info(
            f"sim bridge up: task={self.task} variation={self.variation} cameras={self.cameras} "
            f"image_size={self.image_size} rate={self.rate_hz:g} Hz lockstep={self.lockstep}")

    def _on_params_changed(self, params: BridgeParams) -> None:
        """A live `ros2 param set` (command_timeout_s): the next tick judges commands by the new timeout."""
        self.params = params
        self.command_timeout_ns = int(params.command_timeout_s * 1e9)
        if self._standard is not None:  # the ros2_control interface keeps its own copy for the twists
            self._standard.command_timeout_ns = self.command_timeout_ns
        self.get_logger().info(f"parameters applied: commands are stale after {self.command_timeout_ns / 1e9:g} s")

    # ------------------------------------------------------------------ environment
    def _build_env(self, task: str, variation: str) -> None:
        from fed_ros.sim.envs import make_env
        if self.env is not None:
            self.env.close()
        self.env = make_env(task, variation=variation, cameras=self.cameras,
                            image_size=self.image_size, seed=self.seed, horizon=self.horizon or None)
        self.task, self.variation = task, variation
        sim = self.env.raw_env.sim
        # Velocities come straight from the simulator state, as a real driver reports them.
        self._joint_qvel = np.array([sim.model.get_joint_qvel_addr(j) for j in self.env.joint_names])
        self._grip_qvel = np.array([sim.model.get_joint_qvel_addr(j)
                                    for j in self.env.gripper_joint_names])

    def _reset(self, seed: int) -> None:
        self._obs = self.env.reset(seed=int(seed))
        self.episode += 1
        self.step_index = 0
        self.done = False
        self.success = False
        self._command = None
        self._held_gripper = -1.0
        if self._standard is not None:
            self._standard.reset()
        else:
            self._pub_task.publish(self._String(data=self.env.instruction))
        self._publish_observation()

    def _on_reset(self, request, response):
        """ResetEpisode: optionally switch task/variation, then start a new episode."""
        from fed_ros.sim.envs import TASKS, VARIATIONS
        task = request.task or self.task
        variation = request.variation or self.variation
        seed = int(request.seed) if request.seed >= 0 else self.seed + self.episode
        if task not in TASKS:
            response.ok, response.message = False, f"unknown task {task!r}; known: {list(TASKS)}"
            self.get_logger().warning(f"reset refused: {response.message}")
            return response
        if variation not in VARIATIONS:
            response.ok = False
            response.message = f"unknown variation {variation!r}; known: {sorted(VARIATIONS)}"
            self.get_logger().warning(f"reset refused: {response.message}")
            return response
        try:
            if task != self.task:
                self._build_env(task, variation)
            elif variation != self.variation:
                self.env.set_variation(variation)
                self.variation = variation
            self._reset(seed)
        except Exception as exc:  # a failed reset must not take the driver down
            response.ok, response.message = False, f"reset failed: {exc}"
            self.get_logger().error(response.message)
            return response
        response.ok = True
        response.message = f"episode {self.episode}: {task}/{variation} seed {seed}"
        response.instruction = self.env.instruction
        response.episode = self.episode
        self.get_logger().info(response.message)
        return response

    # ------------------------------------------------------------------ commands
    def _on_command(self, msg) -> None:
        try:
            command = validate_command(msg)
        except ValueError as exc:
            self.rejected += 1
            # Hold still until a valid command arrives: never keep executing the last one.
            self._command = None
            self.get_logger().warning(f"ArmCommand rejected ({self.rejected} so far): {exc}; holding still")
            return
        self._command = command
        self._command_rx_ns = time.monotonic_ns()
        if self.lockstep and not self.done and command.stamp_ns == self._obs_stamp_ns:
            self._step(command)

    def _on_answer(self, delta: np.ndarray, gripper: float) -> None:
        """ros2_control lockstep: the twist (and gripper) answering the latest state arrived."""
        self._held_gripper = gripper
        if self.done:
            self._publish_observation()  # the episode is over: the arm reports, nothing moves
        else:
            self._step(ValidCommand(delta, gripper, False, self._obs_stamp_ns, "twist"))

    def _current_command(self) -> ValidCommand | None:
        command = self._command
        if command is None:
            return None
        if time.monotonic_ns() - self._command_rx_ns > self.command_timeout_ns:
            return None
        return command

    # ------------------------------------------------------------------ control loop
    def _on_tick(self) -> None:
        start = time.monotonic()
        late = self._last_tick is not None and start - self._last_tick > 1.5 * self._period
        self._last_tick = start
        if self.done:
            if self._standard is not None:
                self._publish_observation()  # a real arm keeps reporting its state
            return
        if self._standard is not None:
            delta, gripper, hold = self._standard.current()
            self._held_gripper = gripper  # the gripper controller acts even while the arm holds
            self._step(ValidCommand(delta, gripper, hold, self._obs_stamp_ns, "twist"))
        else:
            self._step(self._current_command())
        if late or time.monotonic() - start > self._period:
            self.overruns += 1
            self.get_logger().warning(
                f"control loop overrun ({self.overruns} so far): tick took "
                f"{(time.monotonic() - start) * 1e3:.1f} ms of a {self._period * 1e3:.1f} ms period",
                throttle_duration_sec=2.0)

    def _step(self, command: ValidCommand | None) -> None:
        """Apply one action (or hold), step the simulator, publish the new observation."""
        hold = command is None or command.hold
        if not hold:
            self._held_gripper = command.gripper  # MODE_HOLD keeps the gripper as it is
        action = np.zeros(ACTION_DIM, dtype=np.float32)
        if not hold:
            action[:3] = command.action
        action[3] = self._held_gripper
        applied = self._ArmCommand()
        applied.header.stamp = at.ns_to_stamp(self._obs_stamp_ns)
        applied.header.frame_id = self.frame_prefix + "base"
        applied.action = action[:3].tolist()
        applied.gripper = float(action[3])
        applied.mode = MODE_HOLD if hold else MODE_OSC_POSITION
        applied.source = command.source if command is not None else "hold"
        if self._standard is None:
            self._pub_applied.publish(applied)
        self._obs, self.done, self.success = self.env.step(action)
        self.step_index += 1
        self.steps_total += 1
        self._publish_observation()

    def _next_stamp_ns(self) -> int:
        # Strictly increasing, so a stamp identifies exactly one tick.
        now = self.get_clock().now().nanoseconds
        self._last_stamp_ns = max(now, self._last_stamp_ns + 1)
        return self._last_stamp_ns

    def _publish_observation(self) -> None:
        stamp_ns = self._next_stamp_ns()
        self._obs_stamp_ns = stamp_ns
        qvel = self.env.raw_env.sim.data.qvel
        if self._standard is not None:
            self._standard.publish(self._obs, stamp_ns, joint_names=self.env.joint_names,
                                   gripper_names=self.env.gripper_joint_names,
                                   joint_vel=qvel[self._joint_qvel], gripper_vel=qvel[self._grip_qvel],
                                   success=self.success)
            return
        messages = at.observation_messages(
            self._obs, stamp_ns, joint_names=self.env.joint_names,
            gripper_names=self.env.gripper_joint_names, joint_vel=qvel[self._joint_qvel],
            gripper_vel=qvel[self._grip_qvel], frame_prefix=self.frame_prefix)
        published = [(self._publishers_by_topic[rel], msg) for rel, msg in messages.items()
                     if rel in self._publishers_by_topic]
        for publisher, msg in published:
            publisher.publish(msg)
        status = self._EpisodeStatus()
        status.header.stamp = at.ns_to_stamp(stamp_ns)
        status.task, status.instruction, status.variation = self.task, self.env.instruction, self.variation
        status.episode, status.step = self.episode, self.step_index
        status.success, status.done, status.overruns = self.success, self.done, self.overruns
        self._pub_status.publish(status)
        self._last_published = published + [(self._pub_status, status)]
        self._published_at = time.monotonic()

    def _republish_if_unanswered(self) -> None:
        """Lockstep: re-send the current tick's messages (same stamp) every ``republish_s`` while
        nothing answers it. Observation topics are best effort: one lost sample under load left
        the client without a complete observation and the episode stalled until its timeout
        (then counted as a failure). Clients and recordings ignore duplicates of a stamp; an
        idle bridge re-sends one small tick per period (two 84x84 images with cameras)."""
        if not self._last_published or time.monotonic() - self._published_at < self.republish_s:
            return
        for publisher, msg in self._last_published:
            publisher.publish(msg)
        self._published_at = time.monotonic()

    def destroy_node(self) -> None:
        """Close the simulator with the node."""
        if self.env is not None:
            self.env.close()
            self.env = None
        super().destroy_node()


@shutdown.node_main  # ends the process with os._exit after main()'s own teardown
def main(args: list[str] | None = None) -> int | None:
    """Run one sim bridge until shutdown (``fed-ros-sim-bridge --ros-args -p task:=lift``); 2: bad configuration."""
    # Ctrl-C only sets a flag (fed_ros.ros.shutdown): a KeyboardInterrupt raised inside a physics
    # step (robosuite's numba code) ended the process with a SystemError and exit code 1.
    shutdown.init(args)
    node = None
    try:
        try:
            node = SimBridgeNode()
        except ValueError as exc:  # a bad parameter (named) or an environment that cannot be built
            print(f"fed_ros sim bridge: invalid configuration: {exc}", file=sys.stderr)
            return 2
        executor = SingleThreadedExecutor()
        executor.add_node(node)
        while rclpy.ok() and not shutdown.requested():
            executor.spin_once(timeout_sec=0.1)
    except (KeyboardInterrupt, ExternalShutdownException):
        pass
    finally:
        if node is not None:
            node.destroy_node()
        rclpy.try_shutdown()


if __name__ == "__main__":
    main()
