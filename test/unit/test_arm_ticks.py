"""The adapter's tick schedule (fed_ros.core.arm.ticks) with exact arrival times, no ROS."""

from __future__ import annotations

import numpy as np
import pytest

from fed_ros.core.arm.ticks import TickSchedule

PERIOD = 0.05  # 20 Hz


def _ticks(arrivals, timer_times=()):
    """Feed arm messages and timer fires in time order; the times a tick was taken."""
    sched = TickSchedule(PERIOD)
    events = sorted([(t, False) for t in arrivals] + [(t, True) for t in timer_times])
    return [t for t, from_timer in events if sched.take(t, from_timer)], sched


@pytest.mark.parametrize("jitter_s", [0.0, 0.005, 0.012, 0.02])
def test_an_arm_at_exactly_the_control_rate_gets_at_least_095_of_it(jitter_s):
    # 20 Hz for 10 s, each message moved by up to +-jitter (DDS, a loaded host); the timer
    # at the same rate but another phase (it must not steal or add ticks while the arm talks).
    rng = np.random.default_rng(0)
    n = 200
    arrivals = np.arange(n) * PERIOD + rng.uniform(-jitter_s, jitter_s, n) + 1.0
    timer = np.arange(n) * PERIOD + 1.0 + 0.031
    taken, sched = _ticks(arrivals, timer)
    rate = len(taken) / (n * PERIOD)
    assert rate >= 0.95 * 20.0, (
        f"{rate:.1f} ticks/s for a 20 Hz arm (jitter {jitter_s * 1e3:.0f} ms)"
    )
    assert rate <= 20.0 * (1 + 1.0 / n) + 1e-9
    # The rule this replaced (gap >= 0.9 periods) dropped every early message: 14-15/s here.
    assert np.diff(taken).min() >= 0.25 * PERIOD - 1e-12


def test_a_faster_arm_is_ticked_at_the_control_rate_and_never_twice_in_half_a_period():
    rng = np.random.default_rng(1)
    arrivals = np.arange(400) * (PERIOD / 2) + 1.0 + rng.uniform(-0.003, 0.003, 400)  # 40 Hz
    taken, _ = _ticks(arrivals)
    assert 0.95 * 200 <= len(taken) <= 201
    assert np.diff(taken).min() >= 0.25 * PERIOD - 1e-12
    # A backlog delivered at once (a host that stalled): one tick, not a burst.
    sched = TickSchedule(PERIOD)
    assert sched.take(0.0, False)
    burst = [sched.take(0.3 + i * 1e-4, False) for i in range(10)]
    assert burst == [True] + [False] * 9


def test_the_timer_covers_a_silent_arm_at_the_control_rate():
    timer = np.arange(100) * PERIOD + 0.013
    taken, _ = _ticks([0.0], timer)
    assert taken[0] == 0.0
    # The timer tick is taken once the due time is half a period past, then every period.
    assert taken[1] == pytest.approx(0.063 + PERIOD)  # due 0.05: 0.063 < 0.075, 0.113 >= 0.075
    assert np.allclose(np.diff(taken[1:]), PERIOD)


def test_late_arm_ticks_count_overruns_and_do_not_push_the_schedule_back():
    sched = TickSchedule(PERIOD)
    assert sched.take(0.0, False)
    assert sched.take(0.09, False)  # 1.8 periods: an overrun
    assert sched.overruns == 1
    assert sched.due == pytest.approx(0.14)  # 0.04 late (> 1/2 period): restarts from now
    # 0.02 late: the phase is kept, nudged by a fifth of the offset.
    assert sched.take(0.16, False) and sched.due == pytest.approx(0.14 + 0.05 + 0.2 * 0.02)
    assert not sched.take(0.164, False)  # before due - 1/2 period
    assert not sched.take(0.17, False)  # in time, but 0.01 s after the last tick (< 1/4 period)
    assert sched.take(0.18, False) and sched.due == pytest.approx(
        0.194 + 0.05 + 0.2 * (0.18 - 0.194)
    )
    assert sched.overruns == 1
    with pytest.raises(ValueError, match="period"):
        TickSchedule(0.0)
