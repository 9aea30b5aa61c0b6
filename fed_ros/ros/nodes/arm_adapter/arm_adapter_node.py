"""Arm adapter: the package's arm interface (``arm/...``) on standard ROS 2 arm messages.

Policy side (relative to the robot namespace, what ArmClient and Recorder use, see
:mod:`fed_ros.ros.arm.topics`): observations stamped per tick, ``arm/command`` in,
``arm/applied_command`` / ``arm/episode_status`` out, ``arm/reset`` service, and
``arm/hold`` (std_msgs/Bool: true stops the arm at once, false releases).

Arm side (names from the arm profile, :mod:`fed_ros.core.arm.profile`):

    commands (twist, joints, gripper, home)  -> :mod:`fed_ros.ros.nodes.arm_adapter.arm_commands`
    sensor_msgs/JointState (all joints)     -> arm/joint_states + arm/gripper_state (profile order)
    geometry_msgs/PoseStamped               -> arm/eef_pose
    cameras (Image / CompressedImage)       -> arm/<camera>/image_raw (rgb8, resized)
    std_msgs/Float32MultiArray (perception) -> arm/object_state (zeros when the profile has none)
    std_msgs/Bool task success              -> EpisodeStatus.success / done

Each tick (``control_rate_hz``) the safety filter (:mod:`fed_ros.core.arm.safety`) turns the
newest policy command into what is sent (clipped, workspace box, watchdog, hold), the
applied command is published stamped with the observation it answered, and the newest
arm state is re-published under one new tick stamp (the synchronisation rule).

The node wires these concepts together, each in its own module of :mod:`fed_ros.ros.arm`:
the arm-side inputs (``arm_inputs``), the control loop with every stop path
(``control``), the policy-side observations (``observations``), the episode
(``episode``) and its ResetEpisode service (``reset``).
"""

from __future__ import annotations

import threading
import time

import rclpy
from rclpy.callback_groups import MutuallyExclusiveCallbackGroup, ReentrantCallbackGroup
from rclpy.node import Node

from fed_ros.core.arm.profile import load_profile, parse_overrides
from fed_ros.core.arm.safety import SafetyFilter
from fed_ros.core.arm.state import ArmStateStore
from fed_ros.ros import shutdown
from fed_ros.ros.nodes.node_process import run_node
from fed_ros.ros.arm import topics as at
from fed_ros.ros.nodes.arm_adapter.control import ArmControlLoop
from fed_ros.ros.nodes.arm_adapter.episode import AdapterEpisode
from fed_ros.ros.nodes.arm_adapter.gauge import AdapterGauge
from fed_ros.ros.nodes.arm_adapter.observations import ObservationPublisher
from fed_ros.ros.nodes.arm_adapter.reset import EpisodeReset
from fed_ros.ros.nodes.arm_adapter.arm_commands import ArmCommandOutput
from fed_ros.ros.nodes.arm_adapter.arm_inputs import ArmInputs
from fed_ros.ros.nodes.arm_adapter.arm_readiness import missing_arm_topics
from fed_ros.ros.nodes.arm_adapter.stop_paths import stop_and_linger
from fed_ros.ros.configuration.arm_params import AdapterParams
from fed_ros.ros.nodes.typed_params import declare_typed_parameters
from fed_ros.ros.wire import diagnostics, qos


class ArmAdapterNode(Node):
    """One arm: fed_ros arm interface on the policy side, standard messages on the arm side."""

    def __init__(self, **kwargs) -> None:
        super().__init__("arm_adapter", **kwargs)
        # Typed, described parameters (AdapterParams); a live `ros2 param set` is applied or
        # refused.
        self.params = p = declare_typed_parameters(self, AdapterParams, self._on_params_changed)
        self.profile = prof = load_profile(p.profile, parse_overrides(p.profile_overrides))
        self.lockstep = p.lockstep
        self.cameras = dict(prof.cameras) if p.cameras else {}
        self.safety = SafetyFilter(prof)
        # Ticks, commands, stops and the diagnostics snapshot: one at a time.
        self.lock = threading.RLock()

        def clock() -> float:
            # Every time read goes through the module's time (tests drive it with a fake clock).
            return time.monotonic()

        self.state = ArmStateStore(p.state_timeout_s, self.lockstep, clock=clock)
        self.episode = AdapterEpisode(p.task, p.instruction_by_task, p.max_episode_steps, clock)

        from fed_ros.msg import ArmCommand
        from fed_ros.srv import ResetEpisode
        from std_msgs.msg import Bool

        io = ReentrantCallbackGroup()
        self._reset_group = MutuallyExclusiveCallbackGroup()  # reset blocks until home is reached

        # --- policy side (the fed_ros arm interface) ---
        self.observations = ObservationPublisher(
            prof,
            self.cameras,
            self.create_publisher,
            lambda: self.get_clock().now().nanoseconds,
            clock,
        )
        # Commands (twist, joints, gripper, home): the arm_commands module.
        self.commands = ArmCommandOutput(
            prof, self.create_publisher, lambda: self.get_clock().now().to_msg()
        )
        self._arm_pubs = self.commands.expected_subscribers()
        self.control = ArmControlLoop(
            prof,
            self.lock,
            self.safety,
            self.state,
            self.commands,
            self.observations,
            self.episode,
            self.get_logger(),
            clock,
        )
        self.create_subscription(
            ArmCommand,
            at.COMMAND_TOPIC,
            self.control.on_command,
            at.qos_for(at.COMMAND_TOPIC),
            callback_group=io,
        )
        # Reliable so an operator's hold is never dropped; volatile to match any publisher.
        self.create_subscription(
            Bool, "arm/hold", self.control.on_hold, qos.command_qos(depth=10), callback_group=io
        )

        # --- arm side (standard messages): inputs (arm_inputs, arm_readiness) ---
        self.inputs = ArmInputs(
            self.create_subscription,
            prof,
            self.cameras,
            p.image_size,
            self.state,
            self.lock,
            self.get_logger(),
            clock,
            on_state=self.control.on_arm_state,
            on_success=self.episode.record_success,
            callback_group=io,
        )
        self.reset = EpisodeReset(
            self.control, self.inputs.joints_now, self.missing, self.get_logger(), clock
        )
        self.create_service(
            ResetEpisode, at.RESET_SERVICE, self.reset.handle, callback_group=self._reset_group
        )

        # Ticks follow the arm: each end-effector pose (published after the joint states of
        # the same controller cycle) starts one, at most control_rate_hz; the timer keeps
        # the watchdog and the zero twists going when the arm goes quiet.
        self.create_timer(
            prof.period_s, lambda: self.control.on_tick(from_timer=True), callback_group=io
        )
        self.create_timer(p.report_period_s, self._report_missing, callback_group=io)
        gauge = AdapterGauge(
            diagnostics.status_name(self.get_namespace(), "arm_adapter"),
            prof.name,
            lock=self.lock,
            safety=self.safety,
            episode=self.episode,
            missing=self.missing,
            lockstep=self.lockstep,
        )
        diagnostics.attach(  # /diagnostics, 1 Hz
            self.create_publisher,
            self.create_timer,
            lambda: self.get_clock().now().to_msg(),
            gauge,
            callback_group=io,
        )
        self.observations.publish_task(self.episode.instruction())
        self.get_logger().info(
            f"arm adapter up: profile {prof.name} ({prof.description}), "
            f"{prof.control_rate_hz:g} Hz, "
            f"twist -> {self.commands.twist.topic_name}, joints {list(prof.joints.names)}, "
            f"1.0 = {prof.limits.max_linear_speed:g} m/s / {prof.limits.max_angular_speed:g} rad/s"
        )
        self._report_missing()

    def _on_params_changed(self, params: AdapterParams) -> None:
        """A live `ros2 param set` (max_episode_steps): the next step is judged against the new
        cap."""
        with self.lock:
            self.params, self.episode.max_steps = params, params.max_episode_steps
        self.get_logger().info(
            f"parameters applied: episodes now end after {self.episode.max_steps} steps"
        )

    # ------------------------------------------------------------------ readiness
    def missing(self) -> list[str]:
        """Arm-side topics that are not (yet) there, each with what should provide it."""
        return missing_arm_topics(
            self.inputs.subscriptions,
            self._arm_pubs,
            self.count_publishers,
            self.state,
            self.cameras,
            time.monotonic(),
        )

    def _report_missing(self) -> None:
        missing = self.missing()
        if missing:
            self.get_logger().warning(
                f"waiting for the arm ({self.profile.name}): missing " + "; ".join(missing)
            )

    # ------------------------------------------------------------------ stop paths (arm.stop_paths)
    def stop_arm(self, reason: str, final: bool = False) -> None:
        """Latch the hold and send the arm a zero command now (:meth:`ArmControlLoop.stop_arm`)."""
        self.control.stop_arm(reason, final)

    def policy_publishers(self) -> int:
        """How many nodes publish policy commands to this arm (the robot node while it runs)."""
        return self.count_publishers(self.resolve_topic_name(at.COMMAND_TOPIC))


def _stop(node: ArmAdapterNode, executor) -> None:
    # The arm gets its zero command before anything is torn down (a signal only set a flag).
    if rclpy.ok():
        stop_and_linger(node, lambda timeout: executor.spin_once(timeout_sec=timeout))


@shutdown.node_main  # ends the process with os._exit after main()'s own teardown
def main(args: list[str] | None = None) -> int:
    """Run one arm adapter until Ctrl-C / SIGTERM (``--ros-args -p profile:=ur5e``); 2: bad
    configuration (a bad parameter or profile, named: no traceback, no arm to stop)."""
    return run_node("arm adapter", ArmAdapterNode, args, threads=3, stop=_stop)


if __name__ == "__main__":
    main()
