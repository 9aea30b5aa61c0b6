"""Behaviours of a fleet that no DDS test caught when broken (docs/breakage.md), over real DDS.

registration_timeout_s: the real server node (its own process) expects three robots and may start
with two (``min_robots``) only after ``registration_timeout_s``. Two robots register at once (an
rclpy node in the test process); round 0 must not be announced as soon as they are in, but once
the timeout has passed, to the two of them. The ROS-free test of ``ready_to_start``
(test_core_boundaries.py) does not see the server node's wiring of it: passing
``registration_timeout_s=0`` or an unanchored ``waited_s`` there passed every test before.

Resume outcome when the resumed round is trained after the restart: the server is SIGKILLed right
after committing round 0, before round 1's models went out, so the robots have no cached update for
round 1 and train it on what the restarted server sends. test_fleet_resume_outcome.py kills only
where every re-announced round is answered from the robots' caches (and FedAvg of the robots' full
parameters does not depend on the server's model), so a restarted server that re-initialized its
strategy (sending the initial model again for the resumed round) still ended with the uninterrupted
run's models there.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

from conftest import wait_until

pytestmark = pytest.mark.ros

TIMEOUT_S = 20.0  # registration_timeout_s: long against registering two robots, short for the suite
LINE = re.compile(r"^\[\w+\] \[(\d+\.\d+)\] \[[^\]]*server\]: (.*)$")


def server_events(log: Path) -> list[tuple[float, str]]:
    """(ROS time in s, text) of each line the server node logged."""
    text = log.read_text(errors="replace") if log.exists() else ""
    return [(float(m.group(1)), m.group(2)) for m in map(LINE.match, text.splitlines()) if m]


def first(events: list[tuple[float, str]], prefix: str) -> float | None:
    return next((t for t, text in events if text.startswith(prefix)), None)


@pytest.mark.timeout(300)
def test_round_0_waits_for_registration_timeout_with_min_robots_but_not_all_expected(
    tmp_path, ros_env, processes
):
    import rclpy
    from rclpy.context import Context
    from rclpy.executors import SingleThreadedExecutor

    from fed_ros.msg import RoundAnnouncement
    from fed_ros.ros.wire import qos
    from fed_ros.srv import Register
    from fed_ros.ros.wire.service_calls import call_client_until_answered, spinning

    log = tmp_path / "server.log"
    server = processes.start(
        [
            sys.executable,
            "-m",
            "fed_ros.ros.nodes.server.server_node",
            "--ros-args",
            "-r",
            "__ns:=/fleet",
            "-p",
            "algorithm:=fedavg",
            "-p",
            "rounds:=1",
            "-p",
            f"state_dir:={tmp_path / 'server'}",
            "-p",
            "expected_robots:=[robot_0,robot_1,robot_2]",
            "-p",
            "min_robots:=2",
            "-p",
            f"registration_timeout_s:={TIMEOUT_S}",
            "-p",
            "round_timeout_s:=600.0",
            "-p",
            "seed:=0",
        ],
        ros_env,
        log_path=log,
    )
    ctx = Context()
    rclpy.init(context=ctx)
    node = rclpy.create_node("registration_timeout_robots", context=ctx)
    executor = SingleThreadedExecutor(context=ctx)
    executor.add_node(node)
    announcements: list = []
    node.create_subscription(
        RoundAnnouncement, "/fleet/round", announcements.append, qos.latched_qos()
    )
    client = node.create_client(Register, "/fleet/register")

    def spin_until(predicate, timeout: float, what: str):
        def step():
            assert server.poll() is None, (
                f"the server exited ({server.returncode}):\n{log.read_text()[-3000:]}"
            )
            executor.spin_once(timeout_sec=0.05)
            return predicate()

        return wait_until(
            step, timeout, what, interval=0.0, diagnostics=lambda: log.read_text()[-3000:]
        )

    try:
        assert client.wait_for_service(timeout_sec=120.0), log.read_text()[-3000:]
        for rid in ("robot_0", "robot_1"):
            # Asked again while unanswered (fed_ros.ros.wire.service_calls); registering twice is
            # harmless.
            request = Register.Request(robot_id=rid, action_dim=4, num_samples=100, tasks=["lift"])
            answer = call_client_until_answered(
                client,
                request,
                spinning(lambda s: executor.spin_once(timeout_sec=s)),
                attempt_s=10.0,
                timeout_s=60.0,
            )
            assert answer.accepted, answer.reason
        spin_until(
            lambda: announcements,
            TIMEOUT_S + 120.0,
            "round 0 announced after the registration timeout",
        )
    finally:
        node.destroy_node()
        ctx.try_shutdown()
    # The server publishes the announcement, then logs it: the line can trail the message.
    wait_until(
        lambda: "announced round 0 stage train" in log.read_text(errors="replace"),
        30.0,
        "the server's announcement line",
        diagnostics=lambda: log.read_text()[-3000:],
    )
    events = server_events(log)
    waiting = first(
        events, "fleet server: "
    )  # logged right after the server's registration clock started
    registered = first(events, "register 'robot_1': accepted (2 robots)")
    announced = first(events, "announced round 0 stage train")
    assert None not in (waiting, registered, announced), log.read_text()[-3000:]
    # The precondition that makes the check meaningful: min_robots were in well before the timeout.
    assert registered - waiting < TIMEOUT_S - 5.0, (
        f"two robots took {registered - waiting:.1f} s to register: cannot tell a start at "
        f"min_robots from one at the timeout ({TIMEOUT_S} s)"
    )
    # Not as soon as min_robots registered: only once registration_timeout_s had passed.
    assert announced - waiting >= TIMEOUT_S - 0.5, (
        f"round 0 announced {announced - registered:.2f} s after min_robots registered, "
        f"{announced - waiting:.2f} s after the server started waiting (registration_timeout_s "
        f"{TIMEOUT_S})"
    )
    # And then it starts with the robots it has (robot_2 never came).
    ann = announcements[0]
    assert ann.round == 0 and sorted(ann.participants) == ["robot_0", "robot_1"], (
        ann.round,
        ann.participants,
    )


@pytest.mark.timeout(900)
def test_server_killed_after_commit_before_the_next_round_ends_like_uninterrupted(
    tmp_path, ros_env, processes, torch_one_thread
):
    from support.resume_fleet import (
        ROUNDS,
        _final,
        _robot_log,
        _run_fleet,
        assert_same_final_models,
    )

    reference_dir, crashed_dir = tmp_path / "uninterrupted", tmp_path / "crashed"
    _run_fleet(reference_dir, ros_env, processes)
    reference = _final(reference_dir)
    processes.kill_all()  # the reference robots are done; the crashed fleet starts from scratch
    logs = _run_fleet(crashed_dir, ros_env, processes, crash_at=(("committed@0", 0),))
    assert "resumed after committed round 0" in logs[1].read_text()
    assert_same_final_models(reference, _final(crashed_dir))
    for rid in (
        "robot_0",
        "robot_1",
    ):  # round 1 was trained after the restart, once, on what it sent
        text = _robot_log(crashed_dir, rid)
        assert text.count("round 1: trained ") == 1 and "round 1: re-sent the update" not in text, (
            rid
        )
    assert ROUNDS >= 2
