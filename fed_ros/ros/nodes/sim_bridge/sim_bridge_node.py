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
import time

os.environ.setdefault("MUJOCO_GL", "egl")

from rclpy.node import Node  # noqa: E402

from fed_ros.ros import shutdown  # noqa: E402
from fed_ros.ros.nodes.node_process import run_node  # noqa: E402
from fed_ros.ros.arm import topics as at  # noqa: E402
from fed_ros.ros.nodes.sim_bridge.command_validation import (  # noqa: E402
    LatestCommand,
    ValidCommand,
    validate_command,
)
from fed_ros.ros.nodes.sim_bridge.tick_output import DirectArmOutput  # noqa: E402
from fed_ros.ros.nodes.sim_bridge.sim_episode import SimEpisode, reset_refusal  # noqa: E402
from fed_ros.ros.configuration.arm_params import BridgeParams  # noqa: E402
from fed_ros.ros.nodes.typed_params import declare_typed_parameters  # noqa: E402


class SimBridgeNode(Node):
    """One simulated Panda arm: publishes observations, applies commands, resets episodes.

    The episode lives in a :class:`SimEpisode`, the command rules in :class:`LatestCommand`,
    the fed_ros topics in a :class:`DirectArmOutput` (or, with ``interface:=ros2_control``, the
    standard endpoints of a ``Ros2ControlSim``); the node wires them to its parameters, timers,
    subscription and reset service, and times the control loop.
    """

    def __init__(self, **kwargs) -> None:
        super().__init__("sim_bridge", **kwargs)
        # Typed, described parameters (BridgeParams); a live `ros2 param set` is applied or
        # refused.
        self.params = p = declare_typed_parameters(self, BridgeParams, self._on_params_changed)
        self.rate_hz, self.seed, self.lockstep, self.republish_s = (
            p.control_rate_hz,
            p.seed,
            p.lockstep,
            p.lockstep_republish_s,
        )
        self.interface = p.interface
        self.sim = SimEpisode(p.cameras, p.image_size, p.seed, p.horizon)
        self.commands = LatestCommand(int(p.command_timeout_s * 1e9))
        self._standard = None  # the ros2_control interface's endpoints
        self._direct: DirectArmOutput | None = None  # the fed_ros arm topics
        if self.interface == "ros2_control":
            # No fed_ros message on this node: the arm adapter talks to it like to a real arm.
            from fed_ros.core.arm.profile import load_profile, parse_overrides
            from fed_ros.ros.nodes.sim_bridge.ros2_control_sim import Ros2ControlSim

            profile = load_profile(p.profile, parse_overrides(p.profile_overrides))
            # Lockstep: a step per twist answering the latest state (ros2_control_sim docstring).
            self._standard = Ros2ControlSim(
                self,
                profile,
                self.commands.timeout_ns,
                on_home=lambda: self._reset(self.seed + self.sim.episode),
                on_answer=self._on_answer if self.lockstep else None,
            )
        else:
            from fed_ros.msg import ArmCommand
            from fed_ros.srv import ResetEpisode

            self._direct = DirectArmOutput(self.create_publisher, p.cameras, p.frame_prefix)
            self.create_subscription(
                ArmCommand, at.COMMAND_TOPIC, self._on_command, at.qos_for(at.COMMAND_TOPIC)
            )
            self.create_service(ResetEpisode, at.RESET_SERVICE, self._on_reset)

        self.overruns = 0
        self._obs_stamp_ns = 0
        self._last_stamp_ns = 0
        self._last_tick: float | None = None
        self._period = 1.0 / self.rate_hz

        self.sim.build_env(p.task, p.variation)
        self._reset(self.seed)
        self._timer = None if self.lockstep else self.create_timer(self._period, self._on_tick)
        if self.lockstep and self.republish_s > 0 and self._direct is not None:
            self.create_timer(
                self.republish_s / 2,
                lambda: self._direct.republish_if_unanswered(self.republish_s),
            )
        if self.lockstep and self._standard is not None:  # a standing arm keeps reporting
            self.create_timer(self._period, self._standard.republish)
        self.get_logger().info(
            f"sim bridge up: task={self.sim.task} variation={self.sim.variation} "
            f"cameras={p.cameras} image_size={p.image_size} rate={self.rate_hz:g} Hz "
            f"lockstep={self.lockstep}"
        )

    def _on_params_changed(self, params: BridgeParams) -> None:
        """A live `ros2 param set` (command_timeout_s): the next tick judges commands by the
        new timeout."""
        self.params = params
        self.commands.timeout_ns = int(params.command_timeout_s * 1e9)
        if self._standard is not None:  # the ros2_control interface keeps its own copy
            self._standard.command_timeout_ns = self.commands.timeout_ns
        self.get_logger().info(
            f"parameters applied: commands are stale after {self.commands.timeout_ns / 1e9:g} s"
        )

    # ------------------------------------------------------------------ episodes
    def _reset(self, seed: int) -> None:
        self.sim.reset(seed)
        self.commands.clear()
        if self._standard is not None:
            self._standard.reset()
        else:
            self._direct.publish_task(self.sim.env.instruction)
        self._publish_observation()

    def _on_reset(self, request, response):
        """ResetEpisode: optionally switch task/variation, then start a new episode."""
        task = request.task or self.sim.task
        variation = request.variation or self.sim.variation
        seed = int(request.seed) if request.seed >= 0 else self.seed + self.sim.episode
        refusal = reset_refusal(task, variation)
        if refusal:
            response.ok, response.message = False, refusal
            self.get_logger().warning(f"reset refused: {response.message}")
            return response
        try:
            self.sim.switch(task, variation)
            self._reset(seed)
        except Exception as exc:  # a failed reset must not take the driver down
            response.ok, response.message = False, f"reset failed: {exc}"
            self.get_logger().error(response.message)
            return response
        response.ok = True
        response.message = f"episode {self.sim.episode}: {task}/{variation} seed {seed}"
        response.instruction = self.sim.env.instruction
        response.episode = self.sim.episode
        self.get_logger().info(response.message)
        return response

    # ------------------------------------------------------------------ commands
    def _on_command(self, msg) -> None:
        try:
            command = validate_command(msg)
        except ValueError as exc:
            rejected = self.commands.reject()
            self.get_logger().warning(
                f"ArmCommand rejected ({rejected} so far): {exc}; holding still"
            )
            return
        self.commands.accept(command, time.monotonic_ns())
        if self.lockstep and not self.sim.done and command.stamp_ns == self._obs_stamp_ns:
            self._step(command)

    def _on_answer(self, delta, gripper: float) -> None:
        """ros2_control lockstep: the twist (and gripper) answering the latest state arrived."""
        self.sim.held_gripper = gripper
        if self.sim.done:
            self._publish_observation()  # the episode is over: the arm reports, nothing moves
        else:
            self._step(ValidCommand(delta, gripper, False, self._obs_stamp_ns, "twist"))

    # ------------------------------------------------------------------ control loop
    def _on_tick(self) -> None:
        start = time.monotonic()
        late = self._last_tick is not None and start - self._last_tick > 1.5 * self._period
        self._last_tick = start
        if self.sim.done:
            if self._standard is not None:
                self._publish_observation()  # a real arm keeps reporting its state
            return
        if self._standard is not None:
            delta, gripper, hold = self._standard.current()
            self.sim.held_gripper = gripper  # the gripper controller acts even while holding
            self._step(ValidCommand(delta, gripper, hold, self._obs_stamp_ns, "twist"))
        else:
            self._step(self.commands.current(time.monotonic_ns()))
        if late or time.monotonic() - start > self._period:
            self.overruns += 1
            self.get_logger().warning(
                f"control loop overrun ({self.overruns} so far): tick took "
                f"{(time.monotonic() - start) * 1e3:.1f} ms of a "
                f"{self._period * 1e3:.1f} ms period",
                throttle_duration_sec=2.0,
            )

    def _step(self, command: ValidCommand | None) -> None:
        """Apply one action (or hold), step the simulator, publish the new observation."""
        action, hold = self.sim.action_for(command)
        if self._direct is not None:
            source = command.source if command is not None else "hold"
            self._direct.publish_applied(self._obs_stamp_ns, action, hold, source)
        self.sim.step(action)
        self._publish_observation()

    def _next_stamp_ns(self) -> int:
        # Strictly increasing, so a stamp identifies exactly one tick.
        now = self.get_clock().now().nanoseconds
        self._last_stamp_ns = max(now, self._last_stamp_ns + 1)
        return self._last_stamp_ns

    def _publish_observation(self) -> None:
        stamp_ns = self._next_stamp_ns()
        self._obs_stamp_ns = stamp_ns
        if self._standard is None:
            self._direct.publish_tick(self.sim, stamp_ns, self.overruns)
            return
        joint_vel, gripper_vel = self.sim.velocities()
        self._standard.publish(
            self.sim.obs,
            stamp_ns,
            joint_names=self.sim.env.joint_names,
            gripper_names=self.sim.env.gripper_joint_names,
            joint_vel=joint_vel,
            gripper_vel=gripper_vel,
            success=self.sim.success,
        )

    def destroy_node(self) -> None:
        """Close the simulator with the node."""
        self.sim.close()
        super().destroy_node()


@shutdown.node_main  # ends the process with os._exit after main()'s own teardown
def main(args: list[str] | None = None) -> int:
    """Run one sim bridge until shutdown (``fed-ros-sim-bridge --ros-args -p task:=lift``);
    2: bad configuration (a bad parameter, named, or an environment that cannot be built).

    Ctrl-C only sets a flag (fed_ros.ros.shutdown): a KeyboardInterrupt raised inside a physics
    step (robosuite's numba code) ended the process with a SystemError and exit code 1.
    """
    return run_node("sim bridge", SimBridgeNode, args, threads=1, shutdown_executor=False)


if __name__ == "__main__":
    main()
