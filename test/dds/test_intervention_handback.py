"""The hand-back of an intervention (issue 36, deliverables 3 and 4): control returns to the
policy at once, and the human's segment ends there.

In process, on a fake clock (the adapter fixture of test_arm_adapter_ticks.py): a lockstep arm
steps only when its observation is answered, so after a hand-back the policy must be handed an
observation it may answer, or the arm waits for ever (the SIL test's 120-s stall under load).
Over real DDS (a synthetic free-running arm beside the robot's real Recorder): the corrective
segment ends at the hand-back, without the hold steps the arm keeps applying after it.
"""

from __future__ import annotations

import pytest

rclpy = pytest.importorskip("rclpy")

from support.adapter_ticks import _arm_state, _start_episode  # noqa: E402, F401

PERIOD_S = 0.05


def _command(node, stamp_ns: int, source: str, hold: bool = False) -> None:
    from fed_ros.core.arm.safety import MODE_HOLD
    from fed_ros.msg import ArmCommand
    from fed_ros.ros.arm import topics as at

    cmd = ArmCommand()
    cmd.header.stamp = at.ns_to_stamp(stamp_ns)
    cmd.action = [0.0, 0.0, 0.0] if hold else [0.0, 0.0, 0.8]
    cmd.gripper = -1.0
    cmd.mode = MODE_HOLD if hold else 0
    cmd.source = source
    node.control.on_command(cmd)


class LockstepArm:
    """Steps (publishes its next state) only when the adapter answered the current observation;
    records each EpisodeStatus the adapter publishes."""

    def __init__(self, node, clock, monkeypatch) -> None:
        self.node, self.clock, self.statuses = node, clock, []
        self._cycle = 0
        publisher = node.observations._status
        monkeypatch.setattr(publisher, "publish", self.statuses.append)

    def step_if_answered(self) -> bool:
        obs = self.node.observations
        if obs.stamp_ns == 0 or not obs.answered:
            return False
        self._cycle += 1
        self.clock.t += PERIOD_S
        _arm_state(self.node, self.clock, 2_000_000_000 + self._cycle * 50_000_000)
        return True


def _human_drives(node, clock, arm, steps: int) -> int:
    """The teleop answers ``steps`` observations; returns the stamp of the last one it saw."""
    seen = 0
    for _ in range(steps):
        seen = node.observations.stamp_ns
        _command(node, seen, "teleop")
        assert arm.step_if_answered(), "the human's command was not applied"
    assert arm.statuses[-1].human_control
    return seen


def _policy_gets_the_arm_within(node, clock, arm, seconds: float) -> float:
    """Tick the adapter's timer until an unanswered observation says the policy drives; answer
    it as the policy; returns the (fake) seconds that took."""
    start = clock.t
    while clock.t - start <= seconds:
        arm.step_if_answered()
        obs = node.observations
        last = arm.statuses[-1]
        if not last.human_control and not obs.answered and int(last.episode) == 1:
            _command(node, obs.stamp_ns, "policy:abc")
            assert obs.answered, "the policy's answer was not applied"
            return clock.t - start
        clock.t += PERIOD_S
        node.control.on_tick(from_timer=True)
    raise AssertionError(
        f"the policy got no observation to answer in {seconds} s after the hand-back "
        f"(last status: human_control={arm.statuses[-1].human_control}, "
        f"answered={node.observations.answered})"
    )


@pytest.mark.parametrize("adapter", [True], ids=["lockstep"], indirect=True)
def test_a_release_hold_answering_an_older_observation_still_hands_the_arm_back(
    adapter,  # noqa: F811 - the fixture imported above
    monkeypatch,
):
    # Under load the teleop node's newest observation can be one behind the adapter's when
    # the deadman is released: its HOLD answered nothing, the current observation still said
    # human_control, the lockstep arm waited for an answer and the policy for a status saying
    # it may act: nothing moved again (the SIL test's 120-s stall).
    node, clock = adapter
    _start_episode(node, clock)
    arm = LockstepArm(node, clock, monkeypatch)
    seen = _human_drives(node, clock, arm, 5)
    _command(node, seen, "teleop", hold=True)  # stamped with the observation before the current
    waited = _policy_gets_the_arm_within(node, clock, arm, 1.0)
    assert waited <= PERIOD_S, waited
    assert node.episode.control.interventions == 1


@pytest.mark.parametrize("adapter", [True], ids=["lockstep"], indirect=True)
def test_a_teleop_gone_silent_hands_a_lockstep_arm_back_within_handback_s(
    adapter,  # noqa: F811 - the fixture imported above
    monkeypatch,
):
    # A teleop that dies with its deadman held sends no HOLD: silence hands back after
    # handback_s (0.5 s), but a lockstep arm makes no ticks of its own, so nobody told the
    # policy, whose current observation still said human_control.
    node, clock = adapter
    _start_episode(node, clock)
    arm = LockstepArm(node, clock, monkeypatch)
    _human_drives(node, clock, arm, 5)
    waited = _policy_gets_the_arm_within(node, clock, arm, 2.0)
    handback_s = node.episode.control.handback_s
    assert handback_s - 1e-6 <= waited <= handback_s + 2 * PERIOD_S, waited


# --- the segment's end, over real DDS -------------------------------------------------------

from support.recordings import TinyArm, synthetic_ticks, tick_messages  # noqa: E402, F401


class _Log:
    def __init__(self) -> None:
        self.lines: list[str] = []

    def info(self, text: str) -> None:
        self.lines.append(text)

    warning = info


class FreeRunningArm:
    """What a free-running arm adapter publishes at 20 Hz: each tick the command applied in
    answer to the previous observation, then the next observation and its EpisodeStatus
    (``human_control`` while ``human(k)``); the human's steps are applied as ``teleop``, the
    others as holds (the policy waits while the robot node ends the segment)."""

    def __init__(self, arm: TinyArm, human) -> None:
        self.arm, self.human = arm, human
        self.statuses: list = []

    def run(self, ticks: int, pause_after=None) -> None:
        import time

        data = synthetic_ticks(ticks, seed=5, size=8)
        previous = None
        for k, (stamp, obs, action) in enumerate(data):
            msgs = tick_messages(stamp, obs, action, step=k)
            applied = msgs.pop(at_applied())
            if previous is not None:
                self.arm.pubs[at_applied()].publish(previous)
            applied.source = "teleop" if self.human(k) else ""
            applied.mode = 0 if self.human(k) else 3
            status = msgs[at_status()]
            status.human_control = self.human(k)
            for rel, msg in msgs.items():
                self.arm.pubs[rel].publish(msg)
            self.statuses.append(status)
            previous = applied
            if pause_after is not None:
                pause_after(k)
            time.sleep(0.05)


def at_applied() -> str:
    from fed_ros.ros.arm import topics as at

    return at.APPLIED_COMMAND_TOPIC


def at_status() -> str:
    from fed_ros.ros.arm import topics as at

    return at.EPISODE_STATUS_TOPIC


def test_a_corrective_segment_ends_at_the_hand_back_and_the_policy_is_not_kept_waiting(
    ros_context,  # noqa: F811 - the fixture imported above
    tmp_path,
):
    # Issue 36, defect 4: each corrective segment ended with ~1 s of hold steps (16-21 of ~55):
    # the recorder waited out its stop timeout while the adapter applied holds, and the
    # policy stayed paused meanwhile.
    import json
    import threading
    import time

    from conftest import wait_until
    from fed_ros.ros.arm.interventions import InterventionRecorder
    from fed_ros.ros.arm.recorded_episodes import read_recording_metadata
    from fed_ros.ros.arm.recorder import Recorder

    recorder = Recorder(ros_context("robot"), tmp_path, robot_id="robot_0")
    arm = TinyArm(ros_context("arm"))
    arm.wait_for_subscribers(recorder.node)
    log = _Log()
    human = InterventionRecorder(recorder, "default", log)
    takeover_at, handback_at = 5, 15  # the human answers observations 5..14
    stream = FreeRunningArm(arm, lambda k: takeover_at <= k < handback_at)
    took_over = threading.Event()

    def pause_after(k: int) -> None:
        if k == takeover_at:  # the robot starts the segment before the human's first answer
            took_over.wait(10.0)

    runner = threading.Thread(target=stream.run, args=(45, pause_after), daemon=True)
    runner.start()
    wait_until(lambda: len(stream.statuses) > takeover_at, 10.0, "the takeover's status")
    wait_until(
        lambda: (
            recorder._latest.get(at_status(), (b"", 0))[1] == _stamp(stream.statuses[takeover_at])
        ),
        10.0,
        "the takeover's status at the recorder",
    )
    human.takeover(stream.statuses[takeover_at])
    took_over.set()
    wait_until(lambda: len(stream.statuses) > handback_at, 10.0, "the hand-back's status")
    start = time.monotonic()
    human.handback(stream.statuses[handback_at])  # in the policy's thread: it acts after this
    paused = time.monotonic() - start
    runner.join(10.0)  # the arm went on applying holds for 1.5 s
    assert paused < 0.2, f"the policy was kept waiting {paused:.2f} s after the hand-back"
    human.wait()
    assert human.recorded == 1, log.lines
    [meta] = [read_recording_metadata(p.parent) for p in tmp_path.rglob("metadata.yaml")]
    sources = json.loads(meta["custom_data"]["command_sources"])
    assert sources == {"teleop": handback_at - takeover_at}, (sources, log.lines)


def _stamp(status) -> int:
    from fed_ros.ros.arm import topics as at

    return at.stamp_to_ns(status.header.stamp)
