"""ControlArbiter and InterventionTally (fed_ros.core.arm.interventions): who drives the arm
while a policy runs and a human may take over, and the intervention rates (issue 24, item 5).
ROS-free; the SIL test of the whole path is test_intervention_sil.py."""

from __future__ import annotations

import math

import pytest

from fed_ros.core.arm.interventions import ControlArbiter, InterventionTally, is_teleop


def test_a_moving_teleop_command_takes_over_and_the_policy_is_dropped_until_release():
    arb = ControlArbiter(handback_s=0.5)
    assert arb.admit("policy:abc", hold=False, now_s=0.0)
    assert arb.admit("teleop", hold=False, now_s=1.0)  # the deadman pressed: the human drives
    assert arb.human_active(1.1) and arb.interventions == 1
    assert not arb.admit("policy:abc", hold=False, now_s=1.1)
    assert arb.admit("teleop", hold=False, now_s=1.3)
    assert not arb.admit("policy:abc", hold=False, now_s=1.4)
    assert arb.dropped == 2
    for t in (1.5, 1.7, 1.9):  # the teleop node publishes at 20 Hz while the deadman is held
        assert arb.admit("teleop", hold=False, now_s=t)
    assert arb.admit("teleop", hold=True, now_s=2.0)  # deadman released: HOLD, control back
    assert not arb.human_active(2.0)
    assert arb.admit("policy:abc", hold=False, now_s=2.05)
    assert arb.human_seconds(3.0) == pytest.approx(1.0)
    assert arb.interventions == 1  # a takeover is one intervention however many commands


def test_a_silent_teleop_hands_back_after_handback_s_and_counts_its_time_to_the_last_command():
    arb = ControlArbiter(handback_s=0.5)
    arb.admit("teleop", hold=False, now_s=10.0)
    arb.admit("teleop", hold=False, now_s=10.2)
    assert not arb.admit("policy", hold=False, now_s=10.6)  # 0.4 s of silence: still the human
    assert arb.admit("policy", hold=False, now_s=10.8)  # 0.6 s: the teleop died, handed back
    assert arb.human_seconds(11.0) == pytest.approx(0.2)


def test_a_stalled_teleop_stream_that_resumes_soon_is_the_same_intervention():
    # CI run of d289759: a loaded machine paused the teleop stream for > 0.5 s while the
    # deadman was held; the adapter handed back and counted the resumed stream as a second,
    # third, fourth takeover (interventions_per_episode 4.0 for one human).
    arb = ControlArbiter(handback_s=0.5, rejoin_s=3.0)
    arb.admit("teleop", hold=False, now_s=10.0)
    arb.admit("teleop", hold=False, now_s=10.2)
    assert arb.admit("policy", hold=False, now_s=11.0)  # stalled 0.8 s: the policy drives
    arb.admit("teleop", hold=False, now_s=11.4)  # the stream is back, deadman still held
    assert not arb.admit("policy", hold=False, now_s=11.5)  # the human drives again
    arb.admit("teleop", hold=False, now_s=11.6)
    assert arb.interventions == 1
    assert arb.human_seconds(11.6) == pytest.approx(0.2 + 0.2)  # the gap is not human time
    arb.admit("teleop", hold=True, now_s=11.7)  # released: the next press is a new takeover
    arb.admit("teleop", hold=False, now_s=12.0)
    assert arb.interventions == 2
    # Silence longer than rejoin_s: the human came back later, a new intervention.
    arb.admit("teleop", hold=False, now_s=12.1)
    arb.admit("teleop", hold=False, now_s=15.2)
    assert arb.interventions == 3


def test_each_takeover_counts_and_a_new_episode_starts_with_the_policy():
    arb = ControlArbiter()
    for t in (1.0, 3.0):
        arb.admit("teleop", hold=False, now_s=t)
        arb.admit("teleop", hold=True, now_s=t + 0.5)
    arb.admit("teleop:spacemouse", hold=False, now_s=5.0)  # still in control at the episode end
    assert arb.new_episode(5.25) == (3, pytest.approx(1.25))
    assert not arb.human_active(5.3) and arb.interventions == 0 and arb.human_seconds(6) == 0.0
    assert arb.admit("policy", hold=False, now_s=5.3)


def test_a_human_hold_always_passes_and_a_policy_hold_is_dropped_while_the_human_drives():
    arb = ControlArbiter()
    assert arb.admit("teleop", hold=True, now_s=0.0)  # no takeover: nothing counted
    assert arb.interventions == 0
    arb.admit("teleop", hold=False, now_s=1.0)
    assert not arb.admit("policy", hold=True, now_s=1.1)


def test_bad_handback_is_refused_with_the_value():
    for bad in (0, -1.0, math.nan, "1"):
        with pytest.raises(ValueError, match="handback_s"):
            ControlArbiter(handback_s=bad)
        with pytest.raises(ValueError, match="rejoin_s"):
            ControlArbiter(rejoin_s=bad)


def test_is_teleop_names_only_teleop_sources():
    assert is_teleop("teleop") and is_teleop("teleop:xbox")
    assert not is_teleop("policy:teleop") and not is_teleop("teleoperator") and not is_teleop("")


def test_tally_rates_and_bad_episodes():
    tally = InterventionTally()
    assert tally.per_episode == 0.0 and tally.human_seconds_per_episode == 0.0
    tally.add_episode(2, 3.0)
    tally.add_episode(0, 0.0)
    assert tally.summary() == {
        "episodes": 2,
        "interventions_per_episode": 1.0,
        "human_seconds_per_episode": 1.5,
    }
    with pytest.raises(ValueError, match="-1"):
        tally.add_episode(-1, 0.0)
    with pytest.raises(ValueError, match="nan"):
        tally.add_episode(0, math.nan)
