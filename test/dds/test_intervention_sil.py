"""Interventions in the loop (issue 24, item 5: human-gated DAgger): a scripted "human" pressing
a gamepad's deadman takes the arm over from the robot's policy mid-episode, hands it back, and
the next round trains on the human's segment.

Fleet of one (server + sim bridge + arm adapter + robot node, panda_sim) plus a real
teleop node reading the scripted pad's sensor_msgs/Joy. Checked: the adapter drops the policy
while the human drives and labels the applied commands ``teleop``; the robot records the
segment as a corrective demonstration (``source=intervention``); the round report carries the
robot's interventions per episode; round 1 trains on more samples than round 0 by the segment;
the policy's first command reaches the arm within 1 s of the release, and the segment ends
there (no hold steps after the human's last move but the release's HOLD).
"""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest
import yaml

from conftest import wait_until
from fed_ros.core.arm.teleop import teleop_profile_dir
from fed_ros.ros.fleet.fleet_file import fleet_config_from_dict
from fed_ros.ros.fleet.launcher import build_commands, fleet_env
from fed_ros.ros.fleet.plan import plan_fleet

rclpy = pytest.importorskip("rclpy")

from support.arm_adapter_rig import Spun  # noqa: E402

NS = "/robot_0"
DEADMAN, STICK_Z = 9, 3  # xbox profile: LEFTSHOULDER, right stick up = +z


def _fleet(tmp_path, lockstep: bool):
    return fleet_config_from_dict(
        {
            "fleet": {
                "name": "interventions",
                "algorithm": "fedavg",
                "rounds": 2,
                "run_dir": str(tmp_path),
                "seed": 0,
                "server": {
                    "round_timeout_s": 300.0,
                    "exit_when_done": True,
                    "evaluate_every": 1,
                    "eval_episodes": 1,
                },
                "robot_defaults": {
                    "collect_demos_on_start": 2,
                    "train_max_steps": 3,
                    "register_timeout_s": 300.0,
                    "max_episode_steps": 120,
                    "trainer.val_fraction": 0.0,
                    "device": "cpu",
                },
                "bridge": {"lockstep": lockstep, "cameras": False},
                "robots": [{"id": "robot_0", "task": "lift", "profile": "panda_sim"}],
            }
        }
    )


class Human:
    """A gamepad on /robot_0/joy (20 Hz) and a watch on the arm's episode status and the fleet's
    round reports; ``drive(steps)`` holds the deadman with the stick pushed for that many steps
    of the evaluation episode."""

    def __init__(self, node) -> None:
        from fed_ros.msg import ArmCommand, EpisodeStatus, RoundReport
        from fed_ros.ros.arm import topics as at
        from fed_ros.ros.operator.monitor import report_to_dict
        from fed_ros.ros.wire import qos
        from sensor_msgs.msg import Joy

        self._Joy, self._to_dict = Joy, report_to_dict
        self.lock = threading.Lock()
        self.axes, self.buttons = [0.0] * 6, [0] * 21
        self.status = None
        self.human_steps: set[tuple[int, int]] = set()  # (episode, step) the human drove
        self.reports: list[dict] = []
        # (monotonic arrival, source, episode) of each command the arm applied
        self.applied: list[tuple[float, str, int]] = []
        self._pub = node.create_publisher(Joy, f"{NS}/joy", 10)
        node.create_timer(0.05, self._publish)
        node.create_subscription(
            EpisodeStatus,
            f"{NS}/{at.EPISODE_STATUS_TOPIC}",
            self._on_status,
            at.qos_for(at.EPISODE_STATUS_TOPIC),
        )
        node.create_subscription(
            RoundReport, "/fleet/round_report", self._on_report, qos.model_state_qos(16)
        )
        node.create_subscription(
            ArmCommand,
            f"{NS}/{at.APPLIED_COMMAND_TOPIC}",
            self._on_applied,
            at.qos_for(at.APPLIED_COMMAND_TOPIC),
        )

    def _publish(self) -> None:
        with self.lock:
            msg = self._Joy(axes=list(self.axes), buttons=list(self.buttons))
        self._pub.publish(msg)

    def _on_status(self, msg) -> None:
        with self.lock:
            self.status = msg
            if msg.human_control:
                self.human_steps.add((int(msg.episode), int(msg.step)))

    def _on_applied(self, msg) -> None:
        with self.lock:
            episode = -1 if self.status is None else int(self.status.episode)
            self.applied.append((time.monotonic(), msg.source, episode))

    def policy_episode(self, steps: int) -> int | None:
        """The episode in which the arm applied ``steps`` of the policy's commands (the
        evaluation): the start-up demonstrations before it are 2, or more when the expert
        failed one (it did, on a free-running arm under load)."""
        with self.lock:
            episodes = [e for _, src, e in self.applied if src.startswith("policy")]
        return next((e for e in episodes if episodes.count(e) >= steps), None)

    def first_policy_command_after(self, t: float) -> float | None:
        """Arrival of the first command the arm applied from the policy after ``t``."""
        with self.lock:
            return next(
                (a for a, src, _ in self.applied if a > t and src.startswith("policy")), None
            )

    def _on_report(self, msg) -> None:
        with self.lock:
            self.reports.append(self._to_dict(msg))

    def set(self, deadman: bool, stick: float = 0.0) -> None:
        with self.lock:
            self.axes[STICK_Z] = stick
            self.buttons[DEADMAN] = int(deadman)

    def step(self) -> tuple[int, int]:
        with self.lock:
            s = self.status
        return (-1, -1) if s is None else (int(s.episode), int(s.step))


# Lockstep: the simulator steps only on an answer (the 120-s stall of issue 36 was there);
# free-running: the arm ticks at 20 Hz whoever drives it, as a real arm does.
@pytest.mark.timeout(600)
@pytest.mark.parametrize("lockstep", [True, False], ids=["lockstep", "free-running"])
def test_a_human_takes_over_mid_episode_and_the_next_round_trains_on_the_segment(
    tmp_path, ros_env, processes, lockstep
):
    env = fleet_env(base=ros_env)
    commands = build_commands(plan_fleet(_fleet(tmp_path, lockstep)), tmp_path)
    procs = {c.spec.executable: processes.start(c.argv, env, log_path=c.log_path) for c in commands}
    logs = {c.spec.executable: c.log_path for c in commands}
    pad_profile = yaml.safe_load((teleop_profile_dir() / "xbox.yaml").read_text())
    # A loaded CI machine may pause the pad's publisher; and the hand-back below must be the
    # release's, never this watchdog's (which also ends a takeover), so it is far above 5 s.
    pad_profile["watchdog_timeout_s"] = 10.0
    (tmp_path / "pad.yaml").write_text(yaml.safe_dump(pad_profile))
    teleop_log = tmp_path / "teleop.log"
    processes.python(
        ["-m", "fed_ros.ros.nodes.teleop.teleop_node", "--ros-args", "-r", f"__ns:={NS}"]
        + ["-p", f"profile:={tmp_path / 'pad.yaml'}"],
        env,
        log_path=teleop_log,
    )
    spun = Spun("human")
    human = Human(spun.node)
    try:
        # The human steps in once the policy has driven 5 steps of round 0's evaluation.
        eval_episode = wait_until(
            lambda: human.policy_episode(5),
            420,
            "the evaluation episode of round 0",
            diagnostics=lambda: logs["robot_node"].read_text()[-2000:],
        )
        human.set(deadman=True, stick=0.8)  # right stick up: +z, the hand lifts
        wait_until(
            lambda: len([s for s in human.human_steps if s[0] == eval_episode]) >= 8,
            60,
            "eight steps driven by the human",
            diagnostics=lambda: teleop_log.read_text()[-2000:],
        )
        released = time.monotonic()
        human.set(deadman=False)  # released: the policy drives again
        first = human.step()
        # Issue 36: under load the policy once did not drive again within 120 s. It must drive
        # again because of the release (through the pad's and the teleop's 20-Hz ticks), well
        # before the pad's 10-s watchdog could end the takeover: the latency itself is printed
        # as a measurement (docs/teleop.md), not bounded tightly (CI once took 2.1 s with the
        # old 2-s watchdog).
        resumed = wait_until(
            lambda: human.first_policy_command_after(released),
            60,
            "the policy's first command at the arm after the hand-back",
            diagnostics=lambda: logs["robot_node"].read_text()[-2000:],
        )
        print(
            f"hand-back -> first policy command at the arm: {resumed - released:.3f} s "
            f"(released at {time.time() - (time.monotonic() - released):.3f} wall)"
        )
        assert resumed - released < 5.0, f"the policy resumed {resumed - released:.2f} s late"
        wait_until(
            lambda: human.step()[0] > eval_episode or human.step()[1] > first[1] + 5,
            60,
            "the policy driving after the hand-back",
        )
        assert procs["server_node"].wait(timeout=420) == 0, logs["server_node"].read_text()[-3000:]
        robot_log = logs["robot_node"].read_text()
        assert "human took over at step" in robot_log, robot_log[-3000:]
        assert "recorded as a corrective demonstration" in robot_log, robot_log[-3000:]

        # The report of the evaluated round says one takeover in its one episode; the next
        # round's evaluation had no human (0 per episode).
        def evaluated():
            with human.lock:
                lines = {
                    r["round"]: r["robots"][0]
                    for r in human.reports
                    if r["robots"] and r["robots"][0]["success_rate"] >= 0.0  # NaN: not evaluated
                }
            return lines if len(lines) >= 2 else None

        lines = wait_until(
            evaluated, 30, "two evaluated round reports", diagnostics=lambda: human.reports
        )
        first, second = (lines[r] for r in sorted(lines)[:2])
        assert first["interventions_per_episode"] == 1.0, lines
        assert first["human_seconds_per_episode"] > 0.0, lines
        assert second["interventions_per_episode"] == 0.0, lines
        trained = sorted(lines)[:2]
        samples = [lines[r]["num_samples"] for r in trained]
    finally:
        spun.close()

    import json

    from fed_ros.ros.arm.interventions import MIN_SEGMENT_STEPS
    from fed_ros.ros.arm.recorded_episodes import (
        load_recorded_episodes,
        read_recording_metadata,
    )

    episodes = load_recorded_episodes(tmp_path / "robot_0" / "demos")
    corrective = [e for e in episodes if e.metadata["source"] == "intervention"]
    # One intervention, recorded as one corrective segment; a stream that stalled mid-hold
    # (a loaded machine) gives two segments of the same intervention, the policy's steps in
    # the gap in neither (its count stays 1, asserted above).
    assert len(corrective) in (1, 2) and len(episodes) == 2 + len(corrective), [
        e.metadata for e in episodes
    ]
    teleop_steps = upward = 0
    for segment in corrective:
        # The human's steps, labelled teleop by the adapter (not "policy"); the hand moved up.
        custom = read_recording_metadata(segment.metadata["recording"])["custom_data"]
        teleop_steps += json.loads(custom["command_sources"]).get("teleop", 0)
        upward += int((segment.actions[:, 2] > 0).sum())
    # At least one kept segment's worth (MIN_SEGMENT_STEPS): the robot node starts a segment
    # when its policy thread sees the takeover in an EpisodeStatus, so the human's steps applied
    # before that are not in it. In the clean-clone CI of 6b782a4 (2026-12-08) the node saw the
    # takeover at step 6, a stalled stream handed back at step 9 (3 steps recorded) and the
    # statuses of the resumed hold came together, too late to record anything: 3 of the human's
    # >= 8 steps were kept (docs/arms.md, "Interventions", says so).
    assert teleop_steps >= MIN_SEGMENT_STEPS and upward >= MIN_SEGMENT_STEPS, [
        e.metadata for e in corrective
    ]
    # Each segment ends at the hand-back: at most the release's own HOLD after the human's
    # last move (issue 36: a free-running arm's segments ended with 16-21 hold steps).
    for segment in corrective:
        moved = np.flatnonzero(np.any(segment.actions[:, :3] != 0.0, axis=1))
        trailing = len(segment) - 1 - int(moved[-1]) if len(moved) else len(segment)
        assert trailing <= 1, (trailing, segment.actions[:, :3].tolist())
    # Round 1 trained on the demonstrations plus the segment(s).
    assert samples[1] == samples[0] + sum(len(s) for s in corrective), samples
    assert "[ERROR]" not in logs["robot_node"].read_text()
