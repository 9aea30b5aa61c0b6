"""Heartbeats extend a slow robot's deadline (fed_ros.core.rounds.liveness), ROS-free.

A fake clock drives the round coordinator: a robot whose heartbeats show progress is waited for
past the announced deadline (up to the cap), one whose heartbeats stop is dropped once its
extension runs out, and a silence shorter than ``heartbeat_timeout_s`` costs nothing. Hostile
heartbeats (not a participant, replayed, beyond the step budget, no TRAIN stage) extend nothing.
"""

from __future__ import annotations

import numpy as np
import pytest

from fed_ros.core.checks.decisions import LATE, NOT_PARTICIPANT, REPLAY
from fed_ros.core.rounds.coordinator import RoundCoordinator
from fed_ros.core.rounds.liveness import BUDGET, NO_STAGE, LivenessSettings, ProgressLedger
from fed_ros.core.rounds.settings import RoundSettings
from fed_ros.core.rounds.store import ModelStore
from fed_ros.core.security.auth import AllowList, Signer
from fed_ros.core.security.signed_messages import progress_message
from fed_ros.core.strategies.base import make_strategy
from fed_ros.core.strategies.types import ClientUpdate

TIMEOUT = 10.0  # the announced deadline is t0 + this
LIVENESS = LivenessSettings(
    heartbeat_timeout_s=3.0, max_extension_s=20.0, heartbeat_step_budget=100
)


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def _coordinator(tmp_path, clock, liveness=LIVENESS, robots=("fast", "slow"), quorum=0.5):
    model = {"w": np.zeros(3, np.float32)}
    coord = RoundCoordinator(
        make_strategy("fedavg"),
        ModelStore(tmp_path / "store"),
        RoundSettings(
            algorithm="fedavg", rounds=2, quorum_fraction=quorum, round_timeout_s=TIMEOUT
        ),
        model,
        clock=clock,
        liveness=liveness,
    )
    for rid in robots:
        assert coord.register(rid)
    plan = coord.start_round()
    assert plan.stage == "train"
    return coord, plan


def _accepted(outcome) -> list[str]:
    return sorted(r.robot_id for r in outcome.robots if r.accepted)


def _update(rid: str, round_idx: int = 0, value: float = 1.0) -> ClientUpdate:
    u = ClientUpdate(
        robot_id=rid,
        params={"w": np.full(3, value, np.float32)},
        num_samples=10,
        base_round=round_idx,
    )
    u.round_idx = round_idx
    return u


def test_progress_keeps_a_slow_robot_in_the_round_past_the_announced_deadline(tmp_path):
    clock = Clock()
    coord, plan = _coordinator(tmp_path, clock)
    clock.t += 2.0
    assert coord.offer_update(_update("fast"))
    # The slow robot reports progress every 2 s; the announced deadline passes meanwhile.
    for k in range(1, 9):
        clock.t = plan.deadline_s - 6.0 + 2.0 * k
        assert coord.offer_heartbeat("slow", 0, k, (k, 20)), k
        assert coord.poll() == (None, None), f"closed at heartbeat {k} (t={clock.t})"
    assert clock.t > plan.deadline_s + 5.0
    assert coord.offer_update(_update("slow", value=3.0))  # late by the announcement, not by it
    nxt, outcome = coord.poll()
    assert outcome is not None and outcome.completed
    assert _accepted(outcome) == ["fast", "slow"], outcome


def test_without_heartbeats_the_slow_robot_is_dropped_at_the_announced_deadline(tmp_path):
    clock = Clock()
    coord, plan = _coordinator(tmp_path, clock)
    assert coord.offer_update(_update("fast"))
    clock.t = plan.deadline_s + 0.01
    nxt, outcome = coord.poll()
    assert outcome is not None and outcome.completed and _accepted(outcome) == ["fast"]
    assert "straggler" in outcome.status and "slow" in outcome.status, outcome.status
    late = coord.offer_update(_update("slow"))
    assert not late  # the next round is open: round 0 is over


def test_a_robot_whose_heartbeats_stop_is_dropped_when_its_extension_runs_out(tmp_path):
    clock = Clock()
    coord, plan = _coordinator(tmp_path, clock)
    assert coord.offer_update(_update("fast"))
    clock.t = plan.deadline_s - 1.0
    assert coord.offer_heartbeat("slow", 0, 1, (5, 20))
    clock.t = plan.deadline_s + LIVENESS.heartbeat_timeout_s - 1.5
    assert coord.poll() == (None, None)  # within the extension: waited for
    clock.t = plan.deadline_s - 1.0 + LIVENESS.heartbeat_timeout_s + 0.01
    _, outcome = coord.poll()
    assert outcome is not None and _accepted(outcome) == ["fast"]


def test_a_silence_shorter_than_the_timeout_costs_nothing(tmp_path):
    clock = Clock()
    coord, plan = _coordinator(tmp_path, clock)
    assert coord.offer_update(_update("fast"))
    clock.t = plan.deadline_s - 0.5
    assert coord.offer_heartbeat("slow", 0, 1, (5, 20))
    clock.t += 2.9  # past the announced deadline; two heartbeats of a 1.5 s period lost
    assert clock.t > plan.deadline_s
    assert coord.poll() == (None, None)
    assert coord.offer_heartbeat("slow", 0, 2, (9, 20))  # resumed before the timeout
    clock.t += 2.9
    assert coord.poll() == (None, None)


def test_the_cap_bounds_every_extension(tmp_path):
    clock = Clock()
    coord, plan = _coordinator(tmp_path, clock)
    assert coord.offer_update(_update("fast"))
    cap = plan.deadline_s + LIVENESS.max_extension_s
    step = 0
    while clock.t < cap - 0.5:
        step += 1
        assert coord.offer_heartbeat("slow", 0, step, (step, 100))
        assert coord.collector.deadline_for("slow") <= cap
        clock.t += 0.5
    clock.t = cap + 0.01
    refused = coord.offer_heartbeat("slow", 0, step + 1, (step + 1, 100))
    assert not refused and refused.code == LATE
    _, outcome = coord.poll()
    assert outcome is not None and _accepted(outcome) == ["fast"]


def test_no_progress_no_extension(tmp_path):
    clock = Clock()
    coord, plan = _coordinator(tmp_path, clock)
    clock.t = plan.deadline_s - 0.5
    assert coord.offer_heartbeat("slow", 0, 1, (4, 20))
    extended = coord.collector.deadline_for("slow")
    assert extended == pytest.approx(clock.t + LIVENESS.heartbeat_timeout_s)
    clock.t += 1.0
    assert coord.offer_heartbeat("slow", 0, 2, (4, 20))  # alive, but stuck at step 4
    assert coord.collector.deadline_for("slow") == extended
    clock.t += 1.0
    assert coord.offer_heartbeat("slow", 0, 3, (20, 20))  # done: its update is on its way
    assert coord.collector.deadline_for("slow") == pytest.approx(
        clock.t + LIVENESS.heartbeat_timeout_s
    )


def test_the_first_heartbeat_at_step_0_extends_once_and_a_robot_stuck_there_is_dropped(
    tmp_path,
):
    clock = Clock()
    coord, plan = _coordinator(tmp_path, clock)
    assert coord.offer_update(_update("fast"))
    # Training started late (a slow model download): its first heartbeat, at step 0, is let in.
    clock.t = first = plan.deadline_s - 0.5
    assert coord.offer_heartbeat("slow", 0, 1, (0, 20))
    assert coord.collector.deadline_for("slow") == pytest.approx(
        first + LIVENESS.heartbeat_timeout_s
    )
    # Alive but stuck at step 0: its heartbeats keep coming and extend nothing.
    for seq in (2, 3, 4, 5):
        clock.t += 0.7
        assert coord.offer_heartbeat("slow", 0, seq, (0, 20)), seq
        assert coord.collector.deadline_for("slow") == pytest.approx(
            first + LIVENESS.heartbeat_timeout_s
        )
    clock.t = first + LIVENESS.heartbeat_timeout_s + 0.01
    late = coord.offer_heartbeat("slow", 0, 6, (0, 20))
    assert not late and late.code == LATE
    _, outcome = coord.poll()
    assert outcome is not None and _accepted(outcome) == ["fast"]
    assert "straggler" in outcome.status and "slow" in outcome.status, outcome.status


@pytest.mark.parametrize(
    "steps",
    [(0, 0), (20, 20)],
    ids=["nothing_to_train_repeated", "done_repeated"],
)
def test_a_repeated_heartbeat_of_the_same_step_extends_only_once(tmp_path, steps):
    clock = Clock()
    coord, plan = _coordinator(tmp_path, clock)
    assert coord.offer_update(_update("fast"))
    clock.t = first = plan.deadline_s - 0.5
    assert coord.offer_heartbeat("slow", 0, 1, steps)
    for seq in (2, 3, 4):  # "done" said again and again, but no update comes
        clock.t += 0.9
        assert coord.offer_heartbeat("slow", 0, seq, steps), seq
    assert coord.collector.deadline_for("slow") == pytest.approx(
        first + LIVENESS.heartbeat_timeout_s
    )
    clock.t = first + LIVENESS.heartbeat_timeout_s + 0.01
    _, outcome = coord.poll()
    assert outcome is not None and _accepted(outcome) == ["fast"]


def test_zero_cap_means_heartbeats_extend_nothing(tmp_path):
    clock = Clock()
    off = LivenessSettings(heartbeat_timeout_s=3.0, max_extension_s=0.0)
    coord, plan = _coordinator(tmp_path, clock, liveness=off)
    clock.t = plan.deadline_s - 0.5
    assert coord.offer_heartbeat("slow", 0, 1, (4, 20))
    assert coord.collector.deadline_for("slow") == plan.deadline_s


@pytest.mark.parametrize(
    ("robot", "round_idx", "seq", "steps", "code"),
    [
        ("intruder", 0, 1, (1, 10), NOT_PARTICIPANT),
        ("slow", 1, 1, (1, 10), NO_STAGE),
        ("slow", 0, 1, (11, 10), BUDGET),  # more done than expected
        ("slow", 0, 1, (1, 101), BUDGET),  # more expected than the fleet's budget
    ],
)
def test_hostile_heartbeats_are_refused_and_extend_nothing(
    tmp_path, robot, round_idx, seq, steps, code
):
    clock = Clock()
    coord, plan = _coordinator(tmp_path, clock)
    clock.t = plan.deadline_s - 0.5
    decision = coord.offer_heartbeat(robot, round_idx, seq, steps)
    assert not decision and decision.code == code, decision
    assert robot in decision.reason
    assert coord.collector.deadline_for(robot) == plan.deadline_s


def test_replayed_heartbeat_is_refused(tmp_path):
    clock = Clock()
    coord, plan = _coordinator(tmp_path, clock)
    clock.t = plan.deadline_s - 2.0
    assert coord.offer_heartbeat("slow", 0, 5, (5, 20))
    before = coord.collector.deadline_for("slow")
    clock.t += 1.0
    for seq in (5, 4):
        replay = coord.offer_heartbeat("slow", 0, seq, (6, 20))
        assert not replay and replay.code == REPLAY
    assert coord.collector.deadline_for("slow") == before


def test_round_config_local_steps_is_the_step_budget(tmp_path):
    ledger = ProgressLedger(0, 100.0, frozenset({"r"}), {"r": 30}, LIVENESS)
    assert not ledger.offer("r", 0, 1, 1, 31, now=99.0)
    assert ledger.offer("r", 0, 2, 1, 30, now=99.0)


def test_no_heartbeat_outside_a_train_stage(tmp_path):
    clock = Clock()
    coord, plan = _coordinator(tmp_path, clock)
    for rid in ("fast", "slow"):
        assert coord.offer_update(_update(rid))
    nxt, outcome = coord.poll()
    assert outcome is not None and nxt is not None
    coord.collector = None
    refused = coord.offer_heartbeat("slow", 1, 1, (1, 10))
    assert not refused and refused.code == NO_STAGE and "no TRAIN stage" in refused.reason


def test_progress_signature_covers_every_field():
    signer, other = Signer.generate(), Signer.generate()
    allow = AllowList({"slow": signer.public_key})
    sig = signer.sign_progress(3, "slow", 7, 5, 20)
    assert allow.verify_progress("slow", 3, 7, 5, 20, sig) is None
    for changed in ((4, 7, 5, 20), (3, 8, 5, 20), (3, 7, 6, 20), (3, 7, 5, 21)):
        assert "bad signature" in allow.verify_progress("slow", *changed, sig)
    assert "bad signature" in allow.verify_progress(
        "slow", 3, 7, 5, 20, other.sign_progress(3, "slow", 7, 5, 20)
    )
    assert "unknown robot" in allow.verify_progress("ghost", 3, 7, 5, 20, sig)
    with pytest.raises(ValueError, match="steps_done"):
        progress_message(3, "slow", 1, -1, 20)


def test_settings_are_validated():
    with pytest.raises(ValueError, match="heartbeat_timeout_s"):
        LivenessSettings(heartbeat_timeout_s=0)
    with pytest.raises(ValueError, match="max_extension_s"):
        LivenessSettings(max_extension_s=-1)
    with pytest.raises(ValueError, match="heartbeat_step_budget"):
        LivenessSettings(heartbeat_step_budget=0)
