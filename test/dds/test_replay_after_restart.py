"""A server restarted mid-round still refuses replays of what it accepted before (issue 26,
item 4): the replay guard's nonces are kept in the state directory with the round state.

Real server node (signed fleet, DDS, ROS chunks), three scripted signed robots: robot_0 and
robot_1 answer round 0, robot_2 holds back, so the round is still open when the server is
SIGKILLed. The restarted server resumes round 0; an attacker who captured robot_0's signed
update re-sends it byte for byte, and the server refuses it as a replay (audit log), while the
robots' fresh answers (new nonces) are accepted and the round completes.
"""

from __future__ import annotations

import json
import os
import signal
import time

import pytest

from fed_ros.ros.rigs.scripted import ScriptedRobots, make_keys, server_argv

rclpy = pytest.importorskip("rclpy")
pytestmark = pytest.mark.ros

ROBOTS = ("robot_0", "robot_1", "robot_2")


def _spin_until(robots, predicate, timeout: float, what: str, server, log) -> None:
    end = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < end, f"timed out waiting for {what}: {log.read_text()[-3000:]}"
        assert server.poll() is None, log.read_text()[-3000:]
        robots.spin(0.2)


@pytest.mark.timeout(300)
def test_a_restarted_server_refuses_an_update_replayed_from_before_the_restart(
    tmp_path, ros_env, processes
):
    from fed_ros.ros.wire.round_msgs import model_update_msg

    signers = make_keys(tmp_path, ROBOTS)
    argv = server_argv(tmp_path, ROBOTS, rounds=1)
    log1, log2 = tmp_path / "server_1.log", tmp_path / "server_2.log"
    server = processes.start(argv, ros_env, log_path=log1)
    honest = ScriptedRobots(signers, robots=ROBOTS[:2])
    late = ScriptedRobots(signers, robots=ROBOTS[2:], hold=True)  # keeps round 0 open
    try:
        honest.register_all()
        late.register_all()
        _spin_until(
            honest,
            lambda: len(honest.acked & set(honest.sent)) == 2,
            120,
            "both updates of round 0 acknowledged",
            server,
            log1,
        )
        captured_pid = next(p for p in honest.sent if p.startswith(f"{ROBOTS[0]}/r0/"))
        sender, fields = honest.uploads[captured_pid]
        os.kill(server.pid, signal.SIGKILL)
        server.wait(timeout=10)

        dead = {
            tuple(i.endpoint_gid)
            for i in honest.node.get_subscriptions_info_by_topic("/fleet/updates")
        }
        honest.hold = True  # the honest robots answer the re-announced round after the replay
        server = processes.start(argv, ros_env, log_path=log2)
        # The restarted server announces round 0 again (nothing was committed) and its own
        # /fleet/updates reader is matched (DDS lists the killed one until its lease expires).
        _spin_until(
            honest,
            lambda: (
                honest.pending is not None
                and any(
                    tuple(i.endpoint_gid) not in dead
                    for i in honest.node.get_subscriptions_info_by_topic("/fleet/updates")
                )
            ),
            90,
            "round 0 announced again by the restarted server",
            server,
            log2,
        )
        for chunk in sender.chunks():  # the attacker: robot_0's captured update, byte for byte
            honest.pub.publish(model_update_msg(chunk, **fields))
        audit = tmp_path / "state" / "audit.jsonl"

        def refused() -> bool:
            return any(
                "already used (replay)" in json.dumps(entry)
                for entry in map(json.loads, audit.read_text().splitlines())
            )

        _spin_until(honest, refused, 60, "the replay refused in the audit log", server, log2)
        honest.hold, late.hold = False, False
        end = time.monotonic() + 120
        while 0 not in honest.reports and time.monotonic() < end:
            honest.spin(0.1)
            late.spin(0.1)
        assert 0 in honest.reports, log2.read_text()[-3000:]
        assert honest.reports[0].updates_accepted == 3, honest.reports[0]
    finally:
        honest.close()
        late.close()
