"""Every stop path of a real arm ends with a zero command on the arm's topics (issue 24, item 1).

The arm here is a ur5e-shaped stand-in that speaks only standard interfaces (joint states, a
pose, MoveIt Servo twists, forward command controllers, a joint trajectory) and records every
command it receives, in order. The adapter's watchdog is set to 30 s in every test but the
watchdog one, so the zero under test is the only one that can arrive: without it the adapter
keeps repeating the policy's last command and the arm's last twist stays non-zero.

A zero command is: twist all zero, joint velocities all zero, gripper held at its last
commanded position (here closed, 0.79 rad).
"""

from __future__ import annotations

import signal
import threading
import time

import numpy as np
import pytest

from conftest import wait_until
from support.arm_adapter_rig import Spun
from fed_ros.core.arm.profile import load_profile
from support.stop_path_rig import NO_WATCHDOG, NS, RecordingArm, start_adapter

rclpy = pytest.importorskip("rclpy")


class Driver:
    """A policy on the robot side: answers every observation with a move (+x, gripper closed)."""

    def __init__(self, node) -> None:
        from fed_ros.ros.arm.arm_client import ArmClient

        self.client = ArmClient(node, namespace=NS, cameras=False)
        self.stop = threading.Event()
        self.thread: threading.Thread | None = None

    def start(self) -> None:
        self.client.wait_for_arm(60.0)
        _, episode = wait_until(lambda: _try_reset(self.client), 60.0, "the adapter's first reset")

        def drive() -> None:
            while not self.stop.is_set():
                try:
                    stamp, _, _ = self.client.next_observation(episode, 1.0)
                except TimeoutError:
                    continue  # the adapter stopped publishing (it is shutting down): keep trying
                self.client.send(np.array([0.5, 0.0, 0.0, 1.0], np.float32), stamp)

        self.thread = threading.Thread(target=drive, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.stop.set()
        if self.thread is not None:
            self.thread.join(timeout=5)


def _try_reset(client):
    try:
        return client.reset("lift", timeout=30.0)
    except RuntimeError:  # not ready yet (topics still being discovered)
        return None


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_adapter_signal_ends_with_a_zero_command_while_the_policy_still_commands(
    sig, ros_env, processes, tmp_path
):
    profile = load_profile("ur5e")
    adapter = start_adapter(processes, ros_env, tmp_path)
    spun = Spun("arm_and_policy")
    driver = None
    try:
        arm = RecordingArm(spun.node, profile)
        driver = Driver(spun.node)
        driver.start()
        wait_until(arm.moving, 30.0, "the policy moving the arm")
        mark = arm.count()
        adapter.send_signal(sig)
        # The policy keeps commanding; the adapter must hold anyway, then exit cleanly.
        assert adapter.wait(timeout=30) == 0, (tmp_path / "adapter.log").read_text()[-3000:]
        time.sleep(
            0.3
        )  # deliberate: anything still in flight from the adapter lands before the check
        arm.assert_stopped(mark)
        log = (tmp_path / "adapter.log").read_text()
        assert "arm stopped: shutdown; zero command sent" in log
        assert "arm stopped: shutdown: last command to the arm" in log
    finally:
        if driver is not None:
            driver.close()
        spun.close()


def test_an_exception_in_the_adapters_tick_ends_with_a_zero_command(ros_env, tmp_path):
    """In process (to inject the fault): the safety filter raises in the middle of a tick."""
    from rclpy.executors import MultiThreadedExecutor
    from rclpy.parameter import Parameter
    from fed_ros.ros.nodes.arm_adapter.arm_adapter_node import ArmAdapterNode

    profile = load_profile("ur5e")
    context = rclpy.Context()
    rclpy.init(context=context)
    adapter = ArmAdapterNode(
        context=context,
        namespace=NS,
        parameter_overrides=[
            Parameter("profile", value="ur5e"),
            Parameter("cameras", value=False),
            Parameter("profile_overrides", value=NO_WATCHDOG),
            Parameter("max_episode_steps", value=100000),
        ],
    )
    executor = MultiThreadedExecutor(num_threads=3, context=context)
    executor.add_node(adapter)
    spinner = threading.Thread(target=executor.spin, daemon=True)
    spinner.start()
    spun = Spun("arm_and_policy")
    driver = None
    try:
        arm = RecordingArm(spun.node, profile)
        driver = Driver(spun.node)
        driver.start()
        wait_until(arm.moving, 30.0, "the policy moving the arm")
        mark = arm.count()

        def broken_tick(*_args, **_kwargs):
            raise RuntimeError("injected fault in the safety filter")

        adapter.safety.tick = broken_tick
        wait_until(lambda: arm.count() > mark + 5, 10.0, "commands after the fault")
        adapter.safety.tick = type(adapter.safety).tick.__get__(
            adapter.safety
        )  # the loop works again
        n = arm.count()
        wait_until(lambda: arm.count() > n + 10, 10.0, "ticks after the repair")
        # Latched: a loop that failed once does not move the arm again until released or reset.
        arm.assert_stopped(mark)
    finally:
        if driver is not None:
            driver.close()
        spun.close()
        executor.shutdown()
        adapter.destroy_node()
        rclpy.try_shutdown(context=context)
        spinner.join(timeout=5)


def test_e_stop_ends_with_a_zero_command_and_holds_until_released(ros_env, processes, tmp_path):
    from std_msgs.msg import Bool

    profile = load_profile("ur5e")
    start_adapter(processes, ros_env, tmp_path)
    spun = Spun("arm_and_policy")
    driver = None
    try:
        arm = RecordingArm(spun.node, profile)
        estop = spun.node.create_publisher(Bool, f"{NS}/arm/hold", 10)
        driver = Driver(spun.node)
        driver.start()
        wait_until(arm.moving, 30.0, "the policy moving the arm")
        mark = arm.count()
        estop.publish(Bool(data=True))
        wait_until(lambda: arm.count() > mark + 20, 20.0, "ticks while the e-stop is set")
        arm.assert_stopped(mark)
        estop.publish(Bool(data=False))
        n = arm.count()
        wait_until(lambda: arm.moving(n), 20.0, "motion once the e-stop is released")
    finally:
        if driver is not None:
            driver.close()
        spun.close()
