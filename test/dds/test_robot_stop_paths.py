"""The robot node's stop paths on a real arm (issue 24, items 1 and 3): its signals, its death
(the adapter's watchdog), learning switched off mid-episode; and a new arm with no demonstrations.

The robot node drives the arm with its scripted expert (``collect_demos_on_start``) through a
real arm adapter (ur5e profile) to the recording ur5e stand-in of test_arm_stop_paths. The
adapter's watchdog is 30 s except in the watchdog test, so the robot node's own HOLD is the only
zero that can arrive in time.
"""

from __future__ import annotations

import signal

import pytest

from conftest import wait_until
from fed_ros.core.arm.profile import load_profile
from support.stop_path_rig import NS, RecordingArm, start_adapter
from support.arm_adapter_rig import Spun

rclpy = pytest.importorskip("rclpy")


def start_robot(processes, env, tmp_path, **params):
    args = [
        "-m",
        "fed_ros.ros.nodes.robot.robot_node",
        "--ros-args",
        "-r",
        f"__ns:={NS}",
        "-r",
        "__node:=robot",
        "-p",
        f"data_dir:={tmp_path / 'robot_0'}",
        "-p",
        "register_timeout_s:=600.0",
        "-p",
        "collect_demos_on_start:=3",
        "-p",
        "max_episode_steps:=2000",
    ]
    for k, v in params.items():
        args += ["-p", f"{k}:={v}"]
    return processes.python(args, env, log_path=tmp_path / "robot.log")


def _arm_driven_by_robot(processes, ros_env, tmp_path, watchdog="{watchdog_timeout_s: 30.0}"):
    start_adapter(processes, ros_env, tmp_path, watchdog=watchdog)
    robot = start_robot(processes, ros_env, tmp_path)
    spun = Spun("recording_arm")
    arm = RecordingArm(spun.node, load_profile("ur5e"))
    wait_until(
        arm.moving,
        90.0,
        "the robot node's expert moving the arm",
        diagnostics=lambda: (tmp_path / "robot.log").read_text()[-2000:],
    )
    return robot, spun, arm


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_robot_node_signal_mid_episode_ends_with_a_zero_command(sig, ros_env, processes, tmp_path):
    robot, spun, arm = _arm_driven_by_robot(processes, ros_env, tmp_path)
    try:
        mark = arm.count()
        robot.send_signal(sig)
        assert robot.wait(timeout=30) == 0, (tmp_path / "robot.log").read_text()[-3000:]
        n = arm.count()
        wait_until(
            lambda: arm.count() > n + 10, 10.0, "the adapter's ticks after the robot node left"
        )
        arm.assert_stopped(mark, gripper_at=None, stopped_by=n)
    finally:
        spun.close()


def test_robot_node_killed_mid_episode_the_watchdog_sends_the_zero(ros_env, processes, tmp_path):
    robot, spun, arm = _arm_driven_by_robot(processes, ros_env, tmp_path, watchdog="{}")  # 0.25 s
    try:
        mark = arm.count()
        robot.send_signal(signal.SIGKILL)
        robot.wait(timeout=10)
        n = arm.count()
        wait_until(
            lambda: arm.count() > n + 20, 10.0, "the adapter's ticks after the robot node died"
        )
        # Commands the robot node published before it died may still land after `n`, and the
        # adapter repeats the last one until its watchdog trips (0.25 s): the stop is checked
        # over the ticks after that.
        still = arm.count()
        wait_until(lambda: arm.count() > still + 20, 10.0, "the adapter's ticks after the watchdog")
        # The watchdog may have tripped already before the kill (a loaded robot node can pause
        # longer than 0.25 s between commands, e.g. between demonstrations): its full zero then
        # came before `mark`.
        arm.assert_stopped(mark, gripper_at=None, zero_since=0, stopped_by=still)
    finally:
        spun.close()


def test_learning_switched_off_mid_episode_ends_with_a_zero_command(ros_env, processes, tmp_path):
    from std_srvs.srv import SetBool
    from fed_ros.ros.wire.service_calls import call_client_until_answered, threaded

    robot, spun, arm = _arm_driven_by_robot(processes, ros_env, tmp_path)
    try:
        client = spun.node.create_client(SetBool, f"{NS}/robot/set_learning")
        mark = arm.count()
        answer = call_client_until_answered(
            client, SetBool.Request(data=False), threaded(), attempt_s=10.0, timeout_s=60.0
        )
        assert answer.success, answer.message
        n = arm.count()
        wait_until(lambda: arm.count() > n + 20, 10.0, "the adapter's ticks while learning is off")
        assert robot.poll() is None
        arm.assert_stopped(mark, gripper_at=None, stopped_by=n)
        log = (tmp_path / "robot.log").read_text()
        assert "learning switched off: arm episode stopped, HOLD sent" in log
        # Back on: the rest of the demonstrations is collected (the interrupted one was discarded).
        n = arm.count()
        assert call_client_until_answered(
            client, SetBool.Request(data=True), threaded(), attempt_s=10.0, timeout_s=60.0
        ).success
        wait_until(lambda: arm.moving(n), 60.0, "the expert moving the arm again")
        assert "[ERROR]" not in (tmp_path / "robot.log").read_text()
    finally:
        spun.close()


@pytest.mark.timeout(240)
def test_a_robot_without_demonstrations_waits_for_them_then_trains(tmp_path, ros_env, processes):
    """Round answer, /diagnostics and log say 'waiting for demonstrations (have 0 of 2)'; once two
    are on disk the robot trains in the next round; no ERROR is logged."""
    from diagnostic_msgs.msg import DiagnosticArray
    from fed_ros.learning.dataset import synthetic_episodes
    from fed_ros.ros.fleet.launcher import build_commands, fleet_env
    from fed_ros.ros.operator.monitor import FleetMonitor
    from fed_ros.ros.fleet.fleet_file import fleet_config_from_dict
    from fed_ros.ros.fleet.plan import plan_fleet

    config = fleet_config_from_dict(
        {
            "fleet": {
                "name": "new_arm",
                "algorithm": "fedavg",
                "rounds": 2,
                "run_dir": str(tmp_path),
                "server": {"round_timeout_s": 8.0, "max_attempts": 50},
                "robot_defaults": {
                    "train_max_steps": 2,
                    "torch_threads": 1,
                    "trainer.val_fraction": 0.0,
                    "min_demos": 2,
                },
                "robots": [{"id": "robot_0", "task": "lift", "sim": False}],
            }
        }
    )
    env = fleet_env(base=ros_env)
    procs = {
        c.spec.fqn: processes.start(c.argv, env, log_path=c.log_path)
        for c in build_commands(plan_fleet(config, include_server=True), tmp_path)
        if c.spec.executable != "arm_adapter_node"
    }  # training needs no arm
    waiting = "waiting for demonstrations (have 0 of 2)"
    spun = Spun("diagnostics_probe")
    statuses: list[str] = []
    spun.node.create_subscription(
        DiagnosticArray,
        "/diagnostics",
        lambda m: statuses.extend(s.message for s in m.status if s.name.endswith("robot_0/robot")),
        50,
    )
    try:
        with FleetMonitor(track_models=False) as monitor:

            def robot_line(pred):
                monitor.spin_once(0.2)
                assert all(p.poll() is None for p in procs.values()), (
                    f"a node died; logs in {tmp_path / 'logs'}"
                )
                return any(pred(r) for rep in monitor.reports for r in rep["robots"])

            wait_until(
                lambda: robot_line(lambda r: r["reason"] == waiting),
                120.0,
                "the round report naming what robot_0 waits for",
                interval=0.0,
            )
            wait_until(
                lambda: any(waiting in s for s in statuses), 10.0, "the robot's /diagnostics status"
            )
            demos = tmp_path / "robot_0" / "demos"
            for k, episode in enumerate(synthetic_episodes(2, length=20, seed=0)):
                episode.save(demos / f"synthetic_{k}.npz")
            wait_until(
                lambda: robot_line(lambda r: r["accepted"]),
                120.0,
                "robot_0's update accepted",
                interval=0.0,
            )
    finally:
        spun.close()
    log = (tmp_path / "logs" / "robot_0__robot.log").read_text()
    assert f"{waiting}: record some" in log
    assert "[ERROR]" not in log and "Traceback" not in log, log[-3000:]
