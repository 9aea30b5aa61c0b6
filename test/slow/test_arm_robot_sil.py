"""A real robot node process on standard arm interfaces, over DDS: server + robot node ->
arm adapter -> sim bridge (interface ros2_control, lockstep). The robot node records its
demonstrations at start-up through the adapter (no retry needed), trains, and is
evaluated; no fed_ros message type is on any arm-side topic. /diagnostics carries the
robot's, the server's and the adapter's status; the learning gate keeps the robot from
acting while off (the server sees it as absent)."""

from __future__ import annotations

import re
import threading
import time

import pytest

from fed_ros.core.arm.profile import load_profile
from fed_ros.ros.fleet.launcher import build_commands, fleet_env
from fed_ros.ros.fleet.fleet_file import fleet_config_from_dict
from fed_ros.ros.fleet.plan import plan_fleet

rclpy = pytest.importorskip("rclpy")


def _fleet(tmp_path, **robot_defaults):
    return fleet_config_from_dict(
        {
            "fleet": {
                "name": "arm_sil",
                "algorithm": "fedavg",
                "rounds": 1,
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
                    "max_episode_steps": 200,
                    "trainer.val_fraction": 0.0,
                    "device": "cpu",
                    **robot_defaults,
                },
                "bridge": {"lockstep": True, "cameras": False},
                "robots": [{"id": "robot_0", "task": "lift", "profile": "panda_sim"}],
            }
        }
    )


class Probe:
    """An in-process node (own context, spun in a thread) that keeps the newest /diagnostics."""

    def __init__(self) -> None:
        from diagnostic_msgs.msg import DiagnosticArray
        from rclpy.executors import SingleThreadedExecutor

        self.context = rclpy.Context()
        rclpy.init(context=self.context)
        self.node = rclpy.create_node("sil_probe", context=self.context)
        self.status: dict[str, object] = {}
        self.lock = threading.Lock()
        self.node.create_subscription(DiagnosticArray, "/diagnostics", self._on, 50)
        self.executor = SingleThreadedExecutor(context=self.context)
        self.executor.add_node(self.node)
        self.thread = threading.Thread(target=self.executor.spin, daemon=True)
        self.thread.start()

    def _on(self, msg) -> None:
        with self.lock:
            for s in msg.status:
                self.status[s.name] = s

    def get(self, name: str):
        with self.lock:
            return self.status.get(name)

    def close(self) -> None:
        self.executor.shutdown()
        self.node.destroy_node()
        rclpy.try_shutdown(context=self.context)
        self.thread.join(timeout=5)


def _values(status) -> dict[str, str]:
    return {kv.key: kv.value for kv in status.values}


@pytest.mark.timeout(420)
def test_robot_node_records_trains_and_evaluates_through_adapter_and_bridge(
    tmp_path, ros_env, processes
):
    from conftest import wait_until

    env = fleet_env(base=ros_env)
    commands = build_commands(plan_fleet(_fleet(tmp_path)), tmp_path)
    assert [c.spec.executable for c in commands] == [
        "server_node",
        "sim_bridge_node",
        "arm_adapter_node",
        "robot_node",
    ]
    procs = {c.spec.executable: processes.start(c.argv, env, log_path=c.log_path) for c in commands}
    logs = {c.spec.executable: c.log_path for c in commands}
    probe = Probe()
    try:
        # The arm side of the graph: standard messages only (asked while the fleet runs).
        t = load_profile("panda_sim").topics
        arm_topics = {
            f"/robot_0/{n}"
            for n in (
                t.joint_states,
                t.eef_pose,
                t.twist_command,
                t.gripper_command,
                t.home_trajectory,
                t.object_state,
                t.task_success,
            )
        }
        types = wait_until(
            lambda: (lambda ty: ty if arm_topics <= set(ty) else None)(
                dict(probe.node.get_topic_names_and_types())
            ),
            120,
            "the arm-side topics",
        )
        for topic in arm_topics:
            assert not any(ty.startswith("fed_ros/") for ty in types[topic]), (topic, types[topic])

        # The adapter advertises the arm-side topics before the bridge (MuJoCo still loading) is
        # in the graph: wait for the bridge node itself and its publishers before asking for them.
        def bridge_types():
            if ("arm", "/robot_0") not in probe.node.get_node_names_and_namespaces():
                return None
            pubs = probe.node.get_publisher_names_and_types_by_node("arm", "/robot_0")
            subs = probe.node.get_subscriber_names_and_types_by_node("arm", "/robot_0")
            return [ty for _, tys in pubs + subs for ty in tys] if pubs and subs else None

        bridge = wait_until(bridge_types, 120, "the sim bridge node's endpoints")
        assert bridge and not any(ty.startswith("fed_ros/") for ty in bridge), bridge

        # Diagnostics from all three roles while the fleet works.
        for name in (
            "fed_ros/robot_0/robot",
            "fed_ros/fleet/server",
            "fed_ros/robot_0/arm_adapter",
        ):
            wait_until(lambda n=name: probe.get(n), 120, f"/diagnostics status {name}")
        robot_keys = set(_values(probe.get("fed_ros/robot_0/robot")))
        assert {
            "learning_enabled",
            "round",
            "stage",
            "last_model_age_s",
            "last_rejection",
            "transfer_errors",
            "train_steps_per_s",
        } <= robot_keys, robot_keys
        server_keys = set(_values(probe.get("fed_ros/fleet/server")))
        assert {
            "round",
            "stage",
            "robots_registered",
            "updates_accepted",
            "updates_rejected",
            "last_rejection",
        } <= server_keys, server_keys
        adapter = probe.get("fed_ros/robot_0/arm_adapter")
        assert {"watchdog_trips", "clipped_values", "hold", "missing_topics"} <= set(
            _values(adapter)
        )
        assert _values(adapter)["lockstep"] == "True"

        assert procs["server_node"].wait(timeout=360) == 0, logs["server_node"].read_text()[-3000:]
        robot_diag = wait_until(
            lambda: (lambda s: s if s and _values(s)["train_steps_per_s"] != "nan" else None)(
                probe.get("fed_ros/robot_0/robot")
            ),
            30,
            "the robot's training throughput in /diagnostics",
        )
        assert float(_values(robot_diag)["train_steps_per_s"]) > 0
        assert _values(probe.get("fed_ros/fleet/server"))["updates_accepted"] == "1"
    finally:
        probe.close()

    robot_log = logs["robot_node"].read_text()
    # Two expert demonstrations through adapter and bridge, the first two attempts both succeed.
    assert "recorded 2/2 successful demonstrations over ROS" in robot_log, robot_log[-3000:]
    assert len(re.findall(r"demonstration \d+ \(lift, seed \d+\): success", robot_log)) == 2
    assert "failure in" not in robot_log
    assert "round 0: trained 3 steps" in robot_log, robot_log[-3000:]
    server_log = logs["server_node"].read_text()
    assert "robot_0" in server_log
    from fed_ros.core.rounds.store import ModelStore

    snap = ModelStore(tmp_path / "server").load_latest()
    assert snap is not None and snap.round_idx == 0
    # The evaluation ran through the same path: the adapter counted a finished episode.
    assert re.search(r"episode [3-9]: lift at home", logs["arm_adapter_node"].read_text())


@pytest.mark.timeout(300)
def test_learning_gate_off_robot_skips_rounds_until_enabled(tmp_path, ros_env, processes):
    """learning_enabled false: no demonstrations, no round work (diagnostics WARN); ~/set_learning
    true lets the same robot collect, register and train."""
    from conftest import wait_until
    from std_srvs.srv import SetBool

    env = fleet_env(base=ros_env)
    config = _fleet(tmp_path, learning_enabled=False)
    commands = build_commands(plan_fleet(config), tmp_path)
    procs = {c.spec.executable: processes.start(c.argv, env, log_path=c.log_path) for c in commands}
    logs = {c.spec.executable: c.log_path for c in commands}
    probe = Probe()
    try:
        status = wait_until(
            lambda: probe.get("fed_ros/robot_0/robot"), 120, "the robot's diagnostics"
        )
        assert status.level == bytes([1]) and "learning disabled" in status.message, status
        assert _values(status)["learning_enabled"] == "False"
        adapter = wait_until(
            lambda: probe.get("fed_ros/robot_0/arm_adapter"), 60, "the adapter's diagnostics"
        )
        assert _values(adapter)["episode"] == "0"  # gated: the arm was never reset or driven
        assert "waiting for learning_enabled" in logs["robot_node"].read_text()
        assert not list((tmp_path / "robot_0" / "demos").glob("*/metadata.yaml"))
        client = probe.node.create_client(SetBool, "/robot_0/robot/set_learning")
        assert client.wait_for_service(timeout_sec=30)
        # Asked again while unanswered (fed_ros.ros.wire.service_calls); enabling twice is harmless.
        from fed_ros.ros.wire.service_calls import call_client_until_answered, spinning

        answer = call_client_until_answered(
            client, SetBool.Request(data=True), spinning(time.sleep), attempt_s=10.0, timeout_s=60.0
        )
        assert answer.success, answer.message
        assert procs["server_node"].wait(timeout=240) == 0, logs["server_node"].read_text()[-3000:]
    finally:
        probe.close()
    assert "round 0: trained 3 steps" in logs["robot_node"].read_text()
    assert len(list((tmp_path / "robot_0" / "demos").glob("*/metadata.yaml"))) == 2
