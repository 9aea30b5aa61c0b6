"""Teleoperation over real DDS: a gamepad's Joy -> teleop node -> arm adapter (ur5e) -> a recording
arm.

The arm adapter runs with its watchdog at 30 s (test_arm_stop_paths.NO_WATCHDOG), so every zero
twist under test comes from the teleop node's HOLD, never from the adapter's watchdog.
"""

from __future__ import annotations

import math
import re
import signal
import threading
import time

import pytest
import yaml

from conftest import wait_until
from fed_ros.core.arm.profile import load_profile
from fed_ros.core.arm.teleop import teleop_profile_dir

rclpy = pytest.importorskip("rclpy")

from support.stop_path_rig import NS, RecordingArm, _speed, start_adapter  # noqa: E402

from support.arm_adapter_rig import Spun  # noqa: E402

TELEOP = "fed_ros.ros.nodes.teleop.teleop_node"
DEADMAN, STICK_X = 9, 1  # xbox profile: LEFTSHOULDER, LEFTY (up = +x)


class Pad:
    """An Xbox pad (SDL layout: 6 axes, 21 buttons) publishing its state on <ns>/joy at 20 Hz."""

    def __init__(self, node) -> None:
        from sensor_msgs.msg import Joy

        self._Joy = Joy
        self.lock = threading.Lock()
        self.axes, self.buttons = [0.0] * 6, [0] * 21
        self.published = 0  # Joy messages sent so far
        self._pub = node.create_publisher(Joy, f"{NS}/joy", 10)
        node.create_timer(0.05, self._publish)

    def press(self, button: int, joys: int = 4) -> None:
        """Press and release one button, each state held for ``joys`` published Joys (not for a
        fixed time: on a loaded machine this process's timer once published no Joy at all during
        a 0.2 s press, and the teleop node never saw it)."""
        for state in (1, 0):
            with self.lock:
                self.buttons[button] = state
                start = self.published
            wait_until(
                lambda: self.published >= start + joys, 10.0, f"{joys} Joys, button {button}"
            )

    def set(self, deadman: bool, stick: float = 0.8) -> None:
        with self.lock:
            self.axes[STICK_X] = stick
            self.buttons[DEADMAN] = int(deadman)

    def _publish(self) -> None:
        with self.lock:
            msg = self._Joy(axes=list(self.axes), buttons=list(self.buttons))
        self._pub.publish(msg)
        with self.lock:
            self.published += 1


def _reset(node) -> None:
    from fed_ros.ros.arm.arm_client import ArmClient

    client = ArmClient(node, namespace=NS, cameras=False)
    client.wait_for_arm(60.0)

    def attempt():
        try:
            return client.reset("lift", timeout=30.0)
        except RuntimeError:  # not ready yet (topics still being discovered)
            return None

    wait_until(attempt, 60.0, "the adapter's first reset")


def _moving_forward(arm, since: int) -> bool:
    twist = arm.last("twist", since)
    return twist is not None and twist.twist.linear.x > 0.0


def _wait_zero_then_ticks(arm: RecordingArm, mark: int, what: str, ticks: int = 20) -> None:
    """Until a zero twist came after ``mark`` and ``ticks`` more commands after it (so a movement
    after the zero would be seen). On a loaded machine the pad's message can reach the teleop
    node a second late; a fixed count of ticks after the change once ended before the zero
    (clean-clone CI of 181114e: 14 twists, all moving)."""
    zero_at: list[int] = []

    def settled() -> bool:
        with arm.lock:
            after = list(arm.commands[mark:])
        if not zero_at:
            hit = next(
                (i for i, (k, m) in enumerate(after) if k == "twist" and _speed(m) == 0.0), None
            )
            if hit is None:
                return False
            zero_at.append(mark + hit)
        return arm.count() > zero_at[0] + ticks

    wait_until(settled, 20.0, f"a zero twist and {ticks} more ticks after {what}")


def test_teleop_moves_the_arm_only_under_the_deadman_and_ends_with_a_zero(
    ros_env, processes, tmp_path
):
    profile = load_profile("ur5e")
    pad_profile = yaml.safe_load((teleop_profile_dir() / "xbox.yaml").read_text())
    pad_profile["watchdog_timeout_s"] = (
        2.0  # a loaded CI machine may pause a publisher; staleness is unit-tested
    )
    (tmp_path / "pad.yaml").write_text(yaml.safe_dump(pad_profile))
    start_adapter(processes, ros_env, tmp_path)
    log = tmp_path / "teleop.log"
    teleop = processes.python(
        [
            "-m",
            TELEOP,
            "--ros-args",
            "-r",
            f"__ns:={NS}",
            "-p",
            f"profile:={tmp_path / 'pad.yaml'}",
        ],
        ros_env,
        log_path=log,
    )
    spun = Spun("arm_and_pad")
    try:
        arm = RecordingArm(spun.node, profile)
        pad = Pad(spun.node)
        pad.set(deadman=False)  # stick pushed, deadman not held
        _reset(spun.node)
        wait_until(
            lambda: "teleop up" in log.read_text(),
            30.0,
            "the teleop node",
            diagnostics=log.read_text,
        )
        mark = arm.count()
        wait_until(lambda: arm.count() > mark + 30, 20.0, "adapter ticks")  # >= 1.5 s of ticks
        assert not arm.moving(mark), "the arm moved without the deadman"

        pad.set(deadman=True)
        wait_until(
            lambda: _moving_forward(arm, mark),
            20.0,
            "the arm moving under the deadman",
            diagnostics=lambda: log.read_text()[-2000:],
        )

        mark = arm.count()
        pad.set(deadman=False)  # release: the HOLD zeroes the arm (the adapter's watchdog is 30 s)
        _wait_zero_then_ticks(arm, mark, "the release")
        arm.assert_stopped(mark, gripper_at=None)
        wait_until(
            lambda: "holding: deadman released" in log.read_text(), 10.0, "the release logged"
        )

        pad.set(deadman=True)
        mark = arm.count()
        wait_until(lambda: _moving_forward(arm, mark), 20.0, "the arm moving again")
        mark = arm.count()
        pad.set(deadman=True, stick=math.nan)  # a broken device: NaN axes with the deadman held
        _wait_zero_then_ticks(arm, mark, "the NaN")
        arm.assert_stopped(mark, gripper_at=None)
        wait_until(
            lambda: "holding: bad input: Joy has non-finite axes" in log.read_text(),
            10.0,
            "the NaN logged",
            diagnostics=lambda: log.read_text()[-2000:],
        )

        # Buttons: START, B (label failure), BACK -> Record START, then STOP with success false.
        from fed_ros.srv import Record

        calls = []

        def on_record(request, response):
            calls.append((request.command, request.task, request.success))
            response.ok = True
            return response

        spun.node.create_service(Record, f"{NS}/record", on_record)
        pad.set(deadman=False, stick=0.0)  # a valid Joy again (a bad one gives no button events)
        for button in (6, 1, 4):
            pad.press(button)
        wait_until(
            lambda: len(calls) == 2,
            20.0,
            "two Record calls",
            diagnostics=lambda: log.read_text()[-2000:],
        )
        assert calls == [
            (Record.Request.START, "lift", False),
            (Record.Request.STOP, "lift", False),
        ]

        pad.set(deadman=True)
        mark = arm.count()
        wait_until(lambda: _moving_forward(arm, mark), 20.0, "the arm moving before SIGINT")
        mark = arm.count()
        teleop.send_signal(
            signal.SIGINT
        )  # the deadman stays held: only the node's last HOLD stops the arm
        assert teleop.wait(timeout=20) == 0, log.read_text()[-3000:]
        time.sleep(0.3)  # deliberate: anything still in flight lands before the check
        arm.assert_stopped(mark, gripper_at=None)
        assert "HOLD sent: teleop shutting down" in log.read_text()
    finally:
        spun.close()


class _FakeClock:
    def __init__(self) -> None:
        self.t = 1000.0

    def monotonic(self) -> float:
        return self.t


class _Lines:
    """The teleop node's log lines (a stand-in for its rcutils logger, which prints only)."""

    def __init__(self) -> None:
        self.lines: list[tuple[str, str]] = []

    def info(self, text: str, **_) -> None:
        self.lines.append(("info", text))

    def warning(self, text: str, **_) -> None:
        self.lines.append(("warning", text))

    error = warning


@pytest.fixture
def teleop_in_process(ros_env, monkeypatch):
    """A real teleop node (xbox profile) in this process, ticked by hand on a fake clock; its
    published commands and log lines are collected."""
    from rclpy.parameter import Parameter

    from fed_ros.ros.nodes.teleop import teleop_node as mod

    clock = _FakeClock()
    monkeypatch.setattr(mod, "time", clock)
    context = rclpy.Context()
    rclpy.init(context=context)
    node = mod.TeleopNode(
        context=context, parameter_overrides=[Parameter("log_period_s", value=2.0)]
    )
    lines, sent = _Lines(), []
    monkeypatch.setattr(node, "get_logger", lambda: lines)
    monkeypatch.setattr(node._pub, "publish", sent.append)
    try:
        yield node, clock, lines, sent
    finally:
        node.destroy_node()
        rclpy.try_shutdown(context=context)


def test_a_stale_pad_is_logged_and_held_once_however_long_it_stays_stale(teleop_in_process):
    # Issue 36, defect 6: a stale pad logged a warning (and sent a HOLD) on every tick, ~20 in
    # 1.5 s, because the reason names the growing elapsed time.
    from fed_ros.core.arm.safety import MODE_HOLD

    node, clock, lines, sent = teleop_in_process
    buttons = [0] * 21
    buttons[DEADMAN] = 1
    for _ in range(10):  # 0.5 s of a pad held at 20 Hz: the arm moves
        node._on_joy(_Joy(buttons))
        node._tick()
        clock.t += 0.05
    assert sent and all(m.mode != MODE_HOLD for m in sent)
    moving = len(sent)
    for _ in range(40):  # the pad goes silent for 2 s (watchdog 0.5 s): 1.5 s stale
        node._tick()
        clock.t += 0.05
    stale = [text for _, text in lines.lines if "device stale" in text]
    holds = [m for m in sent[moving:] if m.mode == MODE_HOLD]
    assert len(stale) == 1 and len(holds) == 1, (stale, len(holds))
    assert "no Joy for 0.5" in stale[0], stale  # the message still names the elapsed time
    for _ in range(20):  # 1 s more: past log_period_s (2 s) the reason is logged again
        node._tick()
        clock.t += 0.05
    stale = [text for _, text in lines.lines if "device stale" in text]
    assert len(stale) == 2, stale
    assert float(re.search(r"no Joy for ([0-9.]+) s", stale[1]).group(1)) >= 2.5, stale
    assert len([m for m in sent[moving:] if m.mode == MODE_HOLD]) == 1
    node._on_joy(_Joy([0] * 21))  # the pad is back, deadman released: a new reason, a new HOLD
    node._tick()
    assert lines.lines[-1] == ("info", "holding: deadman released")
    assert len([m for m in sent[moving:] if m.mode == MODE_HOLD]) == 2


def _Joy(buttons: list[int]):
    from sensor_msgs.msg import Joy

    return Joy(axes=[0.0, 0.8, 0.0, 0.0, 0.0, 0.0], buttons=list(buttons))
