"""Teleoperation: a SpaceMouse or a gamepad drives the arm through the arm adapter (docs/teleop.md).

Subscribes to the device's ``sensor_msgs/Joy`` (``joy_topic``) and optionally its
``geometry_msgs/Twist`` (``twist_topic``), maps them with a teleop profile
(:mod:`fed_ros.core.arm.teleop`, ``config/teleop``) and publishes ``fed_ros/ArmCommand`` on
``arm/command`` (``source="teleop"``) at ``rate_hz``, each stamped with the newest observation
(``arm/episode_status``) it answers, as :meth:`fed_ros.ros.arm.arm_client.ArmClient.send` does.
The arm moves only while the deadman is held; a released deadman, a stale device or a bad
message sends one HOLD (mode 3: the adapter zeroes the arm at once) and a log line naming why.
On shutdown a HOLD goes out last. Buttons: record start / stop call the robot node's
``fed_ros/srv/Record`` service (STOP with the last label, success by default), gripper toggle
flips the gripper between open and closed.
"""

from __future__ import annotations

import threading
import time

import numpy as np
import rclpy
from rclpy.callback_groups import ReentrantCallbackGroup
from rclpy.duration import Duration
from rclpy.node import Node

from fed_ros.core.arm.safety import MODE_HOLD, MODE_OSC_POSITION
from fed_ros.core.arm.teleop import HOLD_DEADMAN, HoldLog, TeleopMapper, load_teleop_profile
from fed_ros.ros import shutdown
from fed_ros.ros.nodes.node_process import run_node
from fed_ros.ros.arm import topics as at
from fed_ros.ros.configuration.arm_params import TeleopParams
from fed_ros.ros.nodes.typed_params import declare_typed_parameters
from fed_ros.ros.wire import qos


class TeleopNode(Node):
    """Device messages in, ArmCommand out; Record calls on buttons."""

    def __init__(self, **kwargs) -> None:
        super().__init__("teleop", **kwargs)
        # Typed, bounded parameters (fleet.arm_params.TeleopParams); the timeouts change live.
        self.params = p = declare_typed_parameters(self, TeleopParams, self._on_params_changed)
        self.profile = load_teleop_profile(p.profile)
        if self.profile.input == "twist" and not p.twist_topic:
            raise ValueError(f"teleop profile {self.profile.name!r} reads a Twist: set twist_topic")
        self.mapper = TeleopMapper(self.profile)
        self.task, self.record_timeout, self.log_period = p.task, p.record_timeout_s, p.log_period_s
        self.lock = threading.Lock()  # mapper state, observation stamp, what was last sent
        self._obs_ns = 0
        self._instruction = ""
        self._success = True  # label of the recording in progress (label buttons; default success)
        self._holding = ""  # kind of hold the last command was (core.arm.teleop; "": moving)
        self._hold_log = HoldLog(p.log_period_s)
        self._record_busy = threading.Lock()
        self._stopped = False

        from fed_ros.msg import ArmCommand, EpisodeStatus
        from fed_ros.srv import Record
        from geometry_msgs.msg import Twist
        from sensor_msgs.msg import Joy
        from std_msgs.msg import String

        self._ArmCommand, self._Record = ArmCommand, Record
        group = ReentrantCallbackGroup()
        self._pub = self.create_publisher(
            ArmCommand, at.COMMAND_TOPIC, at.qos_for(at.COMMAND_TOPIC, subscriber=False)
        )
        self.create_subscription(
            EpisodeStatus,
            at.EPISODE_STATUS_TOPIC,
            self._on_status,
            at.qos_for(at.EPISODE_STATUS_TOPIC),
            callback_group=group,
        )
        self.create_subscription(
            String, at.TASK_TOPIC, self._on_task, at.qos_for(at.TASK_TOPIC), callback_group=group
        )
        # Best effort takes any driver's publisher (joy: reliable, spacenav: system default).
        self.create_subscription(
            Joy, p.joy_topic, self._on_joy, qos.sensor_qos(depth=10), callback_group=group
        )
        if p.twist_topic:
            self.create_subscription(
                Twist, p.twist_topic, self._on_twist, qos.sensor_qos(depth=10), callback_group=group
            )
        self._record = self.create_client(Record, p.record_service, callback_group=group)
        self.create_timer(1.0 / p.rate_hz, self._tick, callback_group=group)
        self.get_logger().info(
            f"teleop up: profile {self.profile.name} ({self.profile.description}), Joy on "
            f"{self.resolve_topic_name(p.joy_topic)}"
            + (f", Twist on {self.resolve_topic_name(p.twist_topic)}" if p.twist_topic else "")
            + f", commands on {self.resolve_topic_name(at.COMMAND_TOPIC)} at {p.rate_hz:g} Hz; "
            f"hold button {self.profile.buttons['deadman']} (deadman) to move"
        )

    # ------------------------------------------------------------------ inputs
    def _on_status(self, msg) -> None:
        with self.lock:
            self._obs_ns = max(self._obs_ns, at.stamp_to_ns(msg.header.stamp))

    def _on_task(self, msg) -> None:
        self._instruction = msg.data

    def _on_joy(self, msg) -> None:
        with self.lock:
            events = self.mapper.joy(msg.axes, msg.buttons, time.monotonic())
            gripper = self.mapper.gripper
        for event in events:
            if event == "gripper_toggle":
                self.get_logger().info(f"gripper: {'closed' if gripper > 0 else 'open'}")
            elif event in ("label_success", "label_failure"):
                self._success = event == "label_success"
                self.get_logger().info(
                    f"label: {'success' if self._success else 'failure'} (sent with record stop)"
                )
            elif event in ("record_start", "record_stop"):
                self._start_record_call(event)

    def _on_twist(self, msg) -> None:
        lin, ang = msg.linear, msg.angular
        with self.lock:
            self.mapper.twist((lin.x, lin.y, lin.z), (ang.x, ang.y, ang.z), time.monotonic())

    # ------------------------------------------------------------------ commands out
    def _on_params_changed(self, params: TeleopParams) -> None:
        """A live change (already checked): the Record timeout and the hold-log period."""
        with self.lock:
            self.params, self.record_timeout = params, params.record_timeout_s
            self.log_period = self._hold_log.period_s = params.log_period_s
        self.get_logger().info(
            f"parameters applied: record_timeout_s={params.record_timeout_s:g}, "
            f"log_period_s={params.log_period_s:g}"
        )

    def _tick(self) -> None:
        with self.lock:
            if self._stopped:
                return
            out = self.mapper.command(time.monotonic())
            if out.action is not None:
                self._holding = ""
                self._publish(out.action, MODE_OSC_POSITION)
                return
            # One HOLD per kind of hold: the adapter zeroes the arm at once and holds. Keyed on
            # the text, a stale pad (whose reason names the seconds since its last Joy) sent one
            # every tick, each answering the arm's observation in the policy's place.
            changed = out.kind != self._holding
            if changed:
                self._holding = out.kind
                self._publish(np.zeros(4, np.float32), MODE_HOLD)
            log = self._hold_log.should_log(out.kind, time.monotonic())
        if log:
            self._log_hold(out, changed)

    def _publish(self, action: np.ndarray, mode: int) -> None:
        """One ArmCommand answering the newest observation (caller holds the lock)."""
        msg = self._ArmCommand()
        msg.header.stamp = at.ns_to_stamp(self._obs_ns)
        msg.action = [float(v) for v in action[:3]]
        msg.gripper = float(action[3]) if mode != MODE_HOLD else float(self.mapper.gripper)
        msg.mode, msg.source = int(mode), "teleop"
        self._pub.publish(msg)

    def _log_hold(self, out, changed: bool) -> None:
        """Name why the arm holds (HoldLog decides when: a new kind, or log_period_s later)."""
        if out.kind == HOLD_DEADMAN:
            self.get_logger().info("holding: deadman released")
        else:
            self.get_logger().warning(
                f"holding: {out.reason}" + (" (HOLD sent)" if changed else "")
            )

    def send_hold(self, reason: str) -> None:
        """The last command: a HOLD, and no more commands after it (shutdown)."""
        with self.lock:
            self._stopped = True
            self._publish(np.zeros(4, np.float32), MODE_HOLD)
        self.get_logger().warning(f"HOLD sent: {reason}")
        self._pub.wait_for_all_acked(Duration(seconds=1.0))

    # ------------------------------------------------------------------ recording
    def _start_record_call(self, event: str) -> None:
        if not self._record_busy.acquire(blocking=False):
            self.get_logger().warning(f"{event} ignored: a Record call is still running")
            return
        threading.Thread(target=self._record_call, args=(event,), daemon=True).start()

    def _record_call(self, event: str) -> None:
        from fed_ros.ros.wire.service_calls import call_service

        Req = self._Record.Request
        try:
            if event == "record_start":
                request = Req(command=Req.START, task=self.task, instruction=self._instruction)
            else:
                request = Req(command=Req.STOP, task=self.task, success=self._success)
            name = self._record.srv_name
            if not shutdown.wait_for_service(self._record, 5.0):
                self.get_logger().error(f"{event}: no Record service {name!r} after 5 s")
                return
            # One try (call_service): starting or stopping a recording twice is not harmless.
            response = call_service(self._record, request, self.record_timeout)
            if response is None:
                self.get_logger().error(
                    f"{event}: {name!r} did not answer in {self.record_timeout:g} s"
                )
            elif not response.ok:
                self.get_logger().error(f"{event} refused: {response.message}")
            elif event == "record_start":
                self.get_logger().info(f"recording started ({self.task})")
            else:
                self.get_logger().info(
                    f"recording stopped ({'success' if request.success else 'failure'}): "
                    f"{response.num_steps} steps -> {response.episode_path}"
                )
                self._success = True  # the next recording starts unlabelled: success by default
        except shutdown.ShutdownRequested:
            pass
        finally:
            self._record_busy.release()


def _stop(node: TeleopNode, executor) -> None:
    if rclpy.ok():
        node.send_hold("teleop shutting down")  # the arm gets a HOLD last


@shutdown.node_main  # ends the process with os._exit after main()'s own teardown
def main(args: list[str] | None = None) -> int:
    """Run teleoperation until Ctrl-C / SIGTERM; the arm gets a HOLD last. 2: bad configuration
    (a bad parameter or profile, named)."""
    return run_node("teleop", TeleopNode, args, threads=3, stop=_stop)


if __name__ == "__main__":
    main()
