"""Managed operation of the fleet server over DDS (issue 18 item 6): the real server node
with scripted signed robots (fed_ros.ros.rigs.scripted.ScriptedRobots).

- ``/fleet/server/set_rounds`` (std_srvs/SetBool) pauses: the round in progress finishes and
  commits, no new round is announced while the server is observed paused (its parameter and
  its /diagnostics status); resuming through SetParameters (what ``ros2 param set`` calls)
  announces the next round with a deadline counted from the resume, and the federation ends.
- ``/fleet/server/end_fleet`` (std_srvs/Trigger) ends the federation after the current round:
  it commits, the robots see STAGE_DONE and the server exits 0 before its configured rounds.
"""

from __future__ import annotations

import time

import pytest

from fed_ros.ros.rigs.reference_federation import committed_models
from fed_ros.ros.rigs.scripted import (
    ScriptedRobots,
    make_keys,
    server_argv,
    wait_for,
)

SERVER = "/fleet/server"
STATUS = "fed_ros/fleet/server"
ROUND_TIMEOUT_S = 120.0  # server_argv's round_timeout_s


class Observer:
    """What the scripted robots' node sees of the server: announcements, /diagnostics, calls."""

    def __init__(self, robots: ScriptedRobots) -> None:
        from diagnostic_msgs.msg import DiagnosticArray
        from rclpy.parameter_client import AsyncParameterClient
        from std_srvs.srv import SetBool, Trigger
        from fed_ros.msg import RoundAnnouncement
        from fed_ros.ros.wire import qos

        self.robots = robots
        self.announcements: list[tuple[int, str, float]] = []  # (round, stage, deadline s)
        self.statuses: list[
            tuple[int, str, dict]
        ] = []  # the server's /diagnostics: (level, message, values)
        node = robots.node
        node.create_subscription(
            RoundAnnouncement, "/fleet/round", self._on_round, qos.latched_qos()
        )
        node.create_subscription(DiagnosticArray, "/diagnostics", self._on_diagnostics, 10)
        self.params = AsyncParameterClient(node, SERVER)
        self.set_rounds = node.create_client(SetBool, f"{SERVER}/set_rounds")
        self.end_fleet = node.create_client(Trigger, f"{SERVER}/end_fleet")

    def _on_round(self, msg) -> None:
        from fed_ros.ros.wire.round_msgs import STAGE_NAMES

        self.announcements.append(
            (
                int(msg.round),
                STAGE_NAMES.get(int(msg.stage)),
                msg.deadline.sec + msg.deadline.nanosec * 1e-9,
            )
        )

    def _on_diagnostics(self, msg) -> None:
        for s in msg.status:
            if s.name == STATUS:
                self.statuses.append(
                    (
                        s.level[0] if isinstance(s.level, bytes) else int(s.level),
                        s.message,
                        {kv.key: kv.value for kv in s.values},
                    )
                )

    def announced(self, round_idx: int, stage: str) -> bool:
        return any(r == round_idx and s == stage for r, s, _ in self.announcements)

    def ask(self, send, what: str):
        """``send()`` again while unanswered (fed_ros.ros.wire.service_calls: Fast DDS can drop a
        response under load); every request here is idempotent (set, enable, end, get)."""
        from fed_ros.ros.wire.service_calls import call_until_answered, spinning

        return call_until_answered(
            send, spinning(self.robots.spin), attempt_s=10.0, timeout_s=60.0, what=what
        )

    def call(self, client, request, what: str):
        assert client.wait_for_service(timeout_sec=30.0), f"{client.srv_name} never appeared"
        return self.ask(lambda: client.call_async(request), what)

    def get(self, name: str):
        assert self.params.wait_for_services(timeout_sec=30.0), (
            "the server's parameter services never appeared"
        )
        return (
            self.ask(lambda: self.params.get_parameters([name]), f"get {name}").values[0].bool_value
        )

    def set(self, **values):
        from rclpy.parameter import Parameter

        assert self.params.wait_for_services(timeout_sec=30.0), (
            "the server's parameter services never appeared"
        )
        return self.ask(
            lambda: self.params.set_parameters([Parameter(k, value=v) for k, v in values.items()]),
            f"set {values}",
        ).results


def _explain(log, obs: Observer):
    """What a failed wait reports: the server's log tail and what the robots saw."""
    return (
        f"\nannouncements {obs.announcements}\nreports {sorted(obs.robots.reports)}"
        f"\nlast status {obs.statuses[-1:]}\nserver log:\n{log.read_text()[-3000:]}"
    )


def _start(tmp_path, ros_env, processes, rounds: int, extra=()):
    signers = make_keys(tmp_path)
    log = tmp_path / "server.log"
    server = processes.start(
        server_argv(tmp_path, rounds=rounds, extra=extra), ros_env, log_path=log
    )
    robots = ScriptedRobots(signers, hold=True)  # TRAIN answers wait until the test releases them
    obs = Observer(robots)
    alive = lambda: server.poll() is None  # noqa: E731
    assert robots.client.wait_for_service(timeout_sec=90.0), log.read_text()[-2000:]
    robots.register_all()
    wait_for(
        lambda: obs.announced(0, "train"),
        90,
        "round 0's TRAIN announcement",
        poll=robots.spin,
        alive=alive,
    )
    return server, robots, obs, log, alive


@pytest.mark.ros
@pytest.mark.timeout(400)
def test_paused_server_finishes_the_round_announces_none_and_resumes_to_the_end(
    tmp_path, ros_env, processes
):
    from std_srvs.srv import SetBool

    server, robots, obs, log, alive = _start(
        tmp_path, ros_env, processes, rounds=2, extra=("exit_when_done:=true",)
    )
    try:
        assert obs.get("rounds_enabled") is True
        res = obs.call(obs.set_rounds, SetBool.Request(data=False), "set_rounds false")
        assert res.success, res.message
        assert obs.get("rounds_enabled") is False  # `ros2 param get` shows the pause
        robots.hold = False  # round 0 (in progress) is answered, aggregated and committed
        wait_for(
            lambda: 0 in robots.reports, 120, "round 0's report", poll=robots.spin, alive=alive
        )
        assert robots.reports[0].completed
        assert committed_models(tmp_path / "state")[0] == 0

        def paused():  # the server's own account: a round closed, the next is held back
            return [
                v
                for _, _, v in obs.statuses
                if v.get("stage") == "paused" and v.get("round") == "1"
            ]

        wait_for(
            paused,
            60,
            "/diagnostics to show the server paused before round 1",
            poll=robots.spin,
            alive=alive,
        )
        seen = len(paused())
        # Observed paused for three more 1 Hz reports: round 1 is never announced meanwhile.
        wait_for(
            lambda: len(paused()) >= seen + 3,
            60,
            "three more paused reports",
            poll=robots.spin,
            alive=alive,
        )
        assert not any(r >= 1 for r, _, _ in obs.announcements), obs.announcements
        level, message, values = next(
            s for s in reversed(obs.statuses) if s[2].get("stage") == "paused"
        )
        assert level == 1 and "paused" in message and values["rounds_enabled"] == "False"
        assert "rounds paused: round 1 is not announced" in log.read_text()

        resumed_at = time.time()  # ROS time of the server is the system clock
        [result] = obs.set(
            rounds_enabled=True
        )  # what `ros2 param set /fleet/server rounds_enabled true` calls
        assert result.successful, result.reason
        wait_for(
            lambda: obs.announced(1, "train"),
            60,
            "round 1 after the resume",
            poll=robots.spin,
            alive=alive,
        )
        deadline = next(d for r, s, d in obs.announcements if (r, s) == (1, "train"))
        assert (
            deadline >= resumed_at + ROUND_TIMEOUT_S - 0.5
        )  # counted from the resume, not from round 0's end
        wait_for(
            lambda: obs.announced(2, "done"),
            180,
            "the federation to finish",
            poll=robots.spin,
            alive=alive,
        )
        wait_for(lambda: server.poll() is not None, 60, "the server to exit", poll=robots.spin)
        assert server.returncode == 0, log.read_text()[-3000:]
        assert committed_models(tmp_path / "state")[0] == 1 and robots.reports[1].completed
    except AssertionError as exc:
        raise AssertionError(f"{exc}{_explain(log, obs)}") from exc
    finally:
        robots.close()


@pytest.mark.ros
@pytest.mark.timeout(400)
def test_end_fleet_commits_the_round_announces_done_and_exits_0_early(tmp_path, ros_env, processes):
    from std_srvs.srv import Trigger

    server, robots, obs, log, alive = _start(
        tmp_path, ros_env, processes, rounds=5
    )  # exit_when_done false
    try:
        res = obs.call(obs.end_fleet, Trigger.Request(), "end_fleet")
        assert res.success and "round 0" in res.message, res.message
        assert (
            obs.get("exit_when_done") is True
        )  # the end exits like the last round with exit_when_done
        robots.hold = False
        wait_for(
            lambda: obs.announced(1, "done"),
            120,
            "STAGE_DONE after round 0",
            poll=robots.spin,
            alive=alive,
        )
        wait_for(lambda: server.poll() is not None, 60, "the server to exit", poll=robots.spin)
        assert server.returncode == 0, log.read_text()[-3000:]
        assert (
            robots.reports[0].completed and committed_models(tmp_path / "state")[0] == 0
        )  # 1 of 5 rounds
        assert not obs.announced(1, "train") and robots.stage == "done"
        assert "end_fleet: ending the federation after the current round" in log.read_text()
    except AssertionError as exc:
        raise AssertionError(f"{exc}{_explain(log, obs)}") from exc
    finally:
        robots.close()
