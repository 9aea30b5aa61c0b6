"""Arm adapter over real DDS: safety on the wire, a ur5e fleet without its arm, and SIL
(ArmClient/Recorder -> adapter -> sim bridge in ros2_control mode, standard messages only)."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from fed_ros.core.arm.profile import load_profile
from support.arm_adapter_rig import BRIDGE, Spun, _try_reset, start_adapter


def wait_until(cond, timeout: float, what: str, poll: float = 0.05):
    """Poll ``cond`` until truthy; fail naming ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = cond()
        if value:
            return value
        time.sleep(poll)
    pytest.fail(f"timed out after {timeout:.0f} s waiting for {what}")


# --- safety over DDS with a minimal ur5e-shaped arm ------------------------------------------


class TinyUR5e:
    """Publishes /joint_states (+ an extra joint) and /tool0_pose; homes on a trajectory."""

    def __init__(self, node, profile) -> None:
        from geometry_msgs.msg import PoseStamped, TwistStamped
        from sensor_msgs.msg import JointState
        from std_msgs.msg import Float64MultiArray
        from trajectory_msgs.msg import JointTrajectory
        from fed_ros.ros.wire import qos

        self.node, self.profile = node, profile
        self.q = np.zeros(len(profile.joints.names))
        self.position = np.array([-0.45, 0.0, 0.3])
        self.twists: list = []
        self.grippers: list = []
        self._js = node.create_publisher(JointState, "/joint_states", qos.command_qos(depth=10))
        self._pose = node.create_publisher(PoseStamped, "/tool0_pose", qos.sensor_qos())
        self._JointState, self._PoseStamped = JointState, PoseStamped
        node.create_subscription(
            TwistStamped,
            "/servo_node/delta_twist_cmds",
            self.twists.append,
            qos.command_qos(depth=100),
        )
        node.create_subscription(
            Float64MultiArray,
            "/gripper_forward_controller/commands",
            self.grippers.append,
            qos.command_qos(depth=100),
        )
        node.create_subscription(
            JointTrajectory,
            "/scaled_joint_trajectory_controller/joint_trajectory",
            self._home,
            qos.command_qos(depth=10),
        )
        node.create_timer(0.02, self._publish)

    def _home(self, msg) -> None:
        self.q = np.array(msg.points[-1].positions)

    def _publish(self) -> None:
        js = self._JointState(
            name=[
                "robotiq_85_left_knuckle_joint",
                "extra_joint",
                *reversed(self.profile.joints.names),
            ],
            position=[0.1, 9.0, *reversed(self.q.tolist())],
        )
        js.header.stamp = self.node.get_clock().now().to_msg()
        self._js.publish(js)
        pose = self._PoseStamped()
        pose.header.frame_id = "base"
        pose.header.stamp = js.header.stamp
        pose.pose.position.x, pose.pose.position.y, pose.pose.position.z = (
            float(v) for v in self.position
        )
        pose.pose.orientation.w = 1.0
        self._pose.publish(pose)


def test_adapter_clips_boxes_watchdogs_and_holds_over_dds(ros_env, processes, tmp_path):
    from fed_ros.ros.arm.arm_client import ArmClient
    from std_msgs.msg import Bool

    profile = load_profile("ur5e")
    log = tmp_path / "adapter.log"
    start_adapter(
        processes, ros_env, log, "/robot_0", profile="ur5e", cameras="false", report_period_s=1.0
    )
    spun = Spun("tiny_ur5e")
    try:
        arm = TinyUR5e(spun.node, profile)
        client = ArmClient(spun.node, namespace="/robot_0", cameras=False)
        client.wait_for_arm(30.0)
        hold_pub = spun.node.create_publisher(Bool, "/robot_0/arm/hold", 10)
        from diagnostic_msgs.msg import DiagnosticArray

        diags: list = []
        spun.node.create_subscription(
            DiagnosticArray,
            "/diagnostics",
            lambda m: diags.extend(s for s in m.status if s.name == "fed_ros/robot_0/arm_adapter"),
            50,
        )
        instruction, episode = wait_until(lambda: _try_reset(client), 30.0, "a successful reset")
        np.testing.assert_allclose(arm.q, profile.joints.home)
        stamp, obs, status = client.next_observation(episode, 10.0)
        # /joint_states carries all joints in another order: filtered and ordered by the profile.
        np.testing.assert_allclose(obs["joint_pos"], profile.joints.home, atol=1e-6)
        np.testing.assert_allclose(obs["gripper_qpos"], [0.1], atol=1e-6)

        def last_twist():
            return arm.twists[-1].twist if arm.twists else None

        def send_until(action, cond, what):
            def step():
                s, _, _ = client.next_observation(episode, 5.0)
                client.send(np.asarray(action, np.float32), s)
                tw = last_twist()
                return tw is not None and cond(tw)

            wait_until(step, 20.0, what, poll=0.0)

        # Clipping: 3.0 on x becomes the profile's max speed (0.10 m/s), gripper 2.0 -> closed.
        send_until([3.0, 0.0, 0.0, 2.0], lambda t: abs(t.linear.x - 0.10) < 1e-9, "a clipped twist")
        assert arm.twists[-1].header.frame_id == "base"
        wait_until(
            lambda: arm.grippers and abs(arm.grippers[-1].data[0] - 0.79) < 1e-9,
            10.0,
            "gripper closed at the profile's closed position",
        )
        # Workspace: 1 mm below the top, +z is limited to what reaches the face in one period.
        arm.position = np.array([-0.45, 0.0, profile.limits.workspace_max[2] - 0.001])
        send_until([0.0, 0.0, 1.0, 0.0], lambda t: 0 < t.linear.z < 0.021, "a box-limited twist")
        arm.position = np.array([-0.45, 0.0, 0.3])
        # Watchdog: commands stop -> zero twists (and a trip is logged by the counters).
        send_until([0.5, 0.0, 0.0, 0.0], lambda t: t.linear.x > 0.0, "a moving twist")
        wait_until(
            lambda: last_twist() is not None and last_twist().linear.x == 0.0,
            10.0,
            "the watchdog's zero twist",
        )
        # ... and /diagnostics says so: the adapter's status turns WARN naming the watchdog.
        warn = wait_until(
            lambda: next((s for s in reversed(diags) if "watchdog tripped" in s.message), None),
            10.0,
            "a WARN status naming the watchdog on /diagnostics",
        )
        assert (
            warn.level == bytes([1])
            and int({kv.key: kv.value for kv in warn.values}["watchdog_trips"]) >= 1
        )
        # Hold: stops at once although the policy keeps commanding, until released.
        send_until([0.5, 0.0, 0.0, 0.0], lambda t: t.linear.x > 0.0, "moving again")
        hold_pub.publish(Bool(data=True))
        send_until([0.5, 0.0, 0.0, 0.0], lambda t: t.linear.x == 0.0, "the hold's zero twist")
        n = len(arm.twists)
        for _ in range(5):
            s, _, _ = client.next_observation(episode, 5.0)
            client.send(np.array([0.5, 0.0, 0.0, 0.0], np.float32), s)
        wait_until(lambda: len(arm.twists) > n + 3, 10.0, "more ticks while held")
        assert all(t.twist.linear.x == 0.0 for t in arm.twists[n:])
        hold_pub.publish(Bool(data=False))
        send_until([0.5, 0.0, 0.0, 0.0], lambda t: t.linear.x > 0.0, "moving after release")
        client.destroy()
    finally:
        spun.close()


class _StarveArmOnSomeSteps:
    """A policy whose answers on steps 3 and 12 reach the adapter while the simulator process is
    stopped (SIGSTOP) for 0.8 s: the arm publishes nothing, as a CPU-starved one."""

    def __init__(self, policy, arm_pid: int) -> None:
        self.policy, self.arm_pid, self.calls = policy, arm_pid, 0

    def reset(self) -> None:
        self.policy.reset()

    def act(self, obs):
        import os
        import signal

        self.calls += 1
        if self.calls in (3, 12):
            os.kill(self.arm_pid, signal.SIGSTOP)
            threading.Timer(0.8, os.kill, (self.arm_pid, signal.SIGCONT)).start()
            time.sleep(0.6)  # deliberate: the answer leaves once the arm's state is 0.6 s old
        return self.policy.act(obs)


# --- a ur5e fleet with no arm: the nodes start and say what is missing -------------------------


def test_ur5e_fleet_without_arm_names_missing_topics(ros_env, processes, tmp_path):
    from fed_ros.ros.fleet.launcher import build_commands
    from fed_ros.ros.fleet.fleet_file import fleet_config_from_dict
    from fed_ros.ros.fleet.plan import plan_fleet

    config = fleet_config_from_dict(
        {
            "name": "lab",
            "algorithm": "fedavg",
            "rounds": 1,
            "run_dir": str(tmp_path / "run"),
            "robot_defaults": {"register_timeout_s": 5.0},
            "robots": [
                {
                    "id": "ur_1",
                    "task": "wipe_table",
                    "sim": False,
                    "profile": "ur5e",
                    "arm": {"limits": {"max_linear_speed": 0.05}},
                }
            ],
        }
    )
    plan = plan_fleet(config, include_server=False)
    assert [n.executable for n in plan] == ["arm_adapter_node", "robot_node"]  # no simulator
    logs = {}
    for cmd in build_commands(plan, tmp_path / "run"):
        logs[cmd.spec.executable] = tmp_path / f"{cmd.spec.executable}.log"
        processes.start(cmd.argv, ros_env, log_path=logs[cmd.spec.executable])
    wait_until(
        lambda: "waiting for the arm (ur5e)" in logs["arm_adapter_node"].read_text(),
        60.0,
        "the adapter's missing-topics report",
    )
    text = logs["arm_adapter_node"].read_text()
    for expected in (
        "/joint_states (sensor_msgs/JointState, from joint_state_broadcaster): no publisher",
        "/tool0_pose (geometry_msgs/PoseStamped",
        "/servo_node/delta_twist_cmds: no subscriber",
        "/scaled_joint_trajectory_controller/joint_trajectory: no subscriber",
        "1.0 = 0.05 m/s",
    ):
        assert expected in text, expected
    # The robot node came up beside it (its arm topics are the adapter's).
    wait_until(
        lambda: logs["robot_node"].exists() and logs["robot_node"].stat().st_size > 0,
        60.0,
        "robot node output",
    )
    spun = Spun("probe")
    try:
        from fed_ros.ros.arm.arm_client import ArmClient

        client = ArmClient(spun.node, namespace="/ur_1", cameras=False)
        assert client._reset_client.wait_for_service(timeout_sec=30.0)
        with pytest.raises(RuntimeError, match=r"arm not ready: .*/joint_states"):
            client.reset("wipe_table", timeout=30.0)
        client.destroy()
    finally:
        spun.close()


# --- SIL: record, train and evaluate through standard messages only ----------------------------


def test_sil_records_trains_and_evaluates_through_standard_interfaces(
    ros_env, processes, tmp_path, torch_one_thread
):
    """ArmClient + Recorder + scripted expert (the robot node's own code) -> adapter ->
    sim bridge (interface ros2_control). The robot node drives exactly these objects."""
    from fed_ros.learning.configuration_policy import PolicyConfig
    from fed_ros.learning.runner import PolicyRunner
    from fed_ros.learning.configuration_trainer import TrainerConfig
    from fed_ros.learning.trainer import initial_state_dict, train_local
    from fed_ros.ros.arm.arm_client import ArmClient
    from fed_ros.ros.arm.recorder import Recorder
    from fed_ros.sim.experts import make_expert

    ns = "/sil_robot"  # unlike other tests' /robot_0: the graph checks below query by name
    bridge = processes.python(
        [
            "-m",
            BRIDGE,
            "--ros-args",
            "-r",
            f"__ns:={ns}",
            "-r",
            "__node:=arm",
            "-p",
            "interface:=ros2_control",
            "-p",
            "profile:=panda_sim",
            "-p",
            "lockstep:=true",
            "-p",
            "cameras:=false",
            "-p",
            "task:=lift",
        ],
        ros_env,
        log_path=tmp_path / "bridge.log",
    )
    start_adapter(
        processes,
        ros_env,
        tmp_path / "adapter.log",
        ns,
        profile="panda_sim",
        cameras="false",
        max_episode_steps=200,
        lockstep="true",
    )
    spun = Spun("sil_driver")
    try:
        client = ArmClient(spun.node, namespace=ns, cameras=False, source="expert")
        recorder = Recorder(
            spun.node, tmp_path / "demos", namespace=ns, robot_id="robot_0", cameras=False
        )
        client.wait_for_arm(60.0)
        wait_until(lambda: _try_reset(client), 60.0, "the adapter's first reset (arm ready)")

        # The arm side of the graph carries standard messages only.
        profile = load_profile("panda_sim")
        t = profile.topics
        arm_topics = {
            f"{ns}/{name}"
            for name in (
                t.joint_states,
                t.eef_pose,
                t.twist_command,
                t.gripper_command,
                t.home_trajectory,
                t.object_state,
                t.task_success,
            )
        }
        types = dict(spun.node.get_topic_names_and_types())
        assert arm_topics <= set(types), sorted(arm_topics - set(types))
        for topic in arm_topics:
            assert not any(ty.startswith("fed_ros/") for ty in types[topic]), (topic, types[topic])
        bridge_types = [
            ty
            for _, tys in spun.node.get_publisher_names_and_types_by_node("arm", ns)
            + spun.node.get_subscriber_names_and_types_by_node("arm", ns)
            for ty in tys
        ]
        assert bridge_types and not any(ty.startswith("fed_ros/") for ty in bridge_types), (
            bridge_types
        )
        assert types[f"{ns}/{t.twist_command}"] == ["geometry_msgs/msg/TwistStamped"]
        assert types[f"{ns}/{t.home_trajectory}"] == ["trajectory_msgs/msg/JointTrajectory"]

        # Demonstrations, the scripted expert as the teleoperator. Bridge and adapter run in
        # lockstep (each step answers the state before it), so every demonstration succeeds
        # whatever the load: no retries.
        episodes = []
        for seed in range(2):
            instruction, episode = client.reset("lift", timeout=60.0)
            recorder.start("lift", instruction, "default")
            # In the second demonstration the simulator process is starved (stopped) for longer
            # than the adapter's state_timeout_s (0.5 s) while two answers are on their way, as
            # on a loaded machine: still one recorded step per simulator step. (A clean-clone
            # run at load 6-7 once recorded 48 of 58 steps; this starvation did not reproduce
            # that, see docs/testing.md "Open flakes".)
            expert = (
                make_expert("lift", seed=seed)
                if seed == 0
                else _StarveArmOnSomeSteps(make_expert("lift", seed=seed), bridge.pid)
            )
            outcome = client.run_episode(expert, episode, timeout=120.0)
            result = recorder.stop(outcome.success, expected_steps=outcome.steps)
            assert outcome.success and result.success, (
                f"expert demonstration {seed} failed in {outcome.steps} steps"
            )
            assert result.num_steps == outcome.steps  # one recorded step per simulator step
            episodes.append(result.episode)
            # What was recorded is what the arm was told: normalised actions within [-1, 1].
            assert np.all(np.abs(result.episode.actions) <= 1.0)
            assert result.episode.observations["joint_pos"].shape[1] == 7

        # A few training steps on them, then a closed-loop evaluation through the same path.
        cfg = PolicyConfig(
            kind="lowdim",
            embed_dim=32,
            window=3,
            transformer_layers=1,
            transformer_heads=2,
            transformer_ff=64,
            dropout=0.0,
            text_dim=64,
        )
        start = initial_state_dict(cfg, seed=0, episodes=episodes)
        trained = train_local(
            start,
            episodes,
            cfg,
            TrainerConfig(
                device="cpu",
                progress=False,
                val_fraction=0.0,
                max_steps=3,
                batch_size=8,
                rank=8,
                seed=0,
            ),
        )
        assert trained.metrics["steps"] == 3
        _, episode = client.reset("lift", timeout=60.0)
        evaluation = client.run_episode(
            PolicyRunner(trained.params, cfg, device="cpu"), episode, timeout=60.0, max_steps=20
        )
        assert not evaluation.timed_out and (evaluation.steps >= 20 or evaluation.success)
        recorder.destroy()
        client.destroy()
    finally:
        spun.close()
