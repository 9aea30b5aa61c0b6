"""When the arm adapter ticks: follow the arm's own cycle, at most ``control_rate_hz`` on average.

ROS-free, so the rule is tested with exact arrival times. A free-running arm publishes its
state (joint states, then the end-effector pose of the same controller cycle) at about the
control rate, with jitter: DDS delivery, the driver's own scheduling and a loaded host move
each message by a fraction of a period. Each arm message may start a tick; the adapter's timer
starts one only when the arm has gone quiet (the watchdog and the zero twists must go on).

The rule is a schedule, not a minimum gap. Each tick is *due* one period after the previous
one was due; an arm message is taken once it comes no earlier than half a period before its due
time, and the timer fires a tick once the due time is half a period past. The next due time is
one period after the previous due time, its phase nudged by a fifth of the message's offset
from it (so the schedule settles on the arm's mean phase, within half a period), and the next
message is not dropped because one came early or late (after a silence of more than half a period
the schedule starts again from the message). Two arm ticks are at least a quarter period apart and
each takes one due time, so a burst (an arm publishing twice as fast, or a backlog delivered at
once) still gives at most the control rate. While the arm is silent the timer ticks once per
timer period.

Measured with the rule it replaces (a gap of at least 0.9 periods between arm ticks, the timer
after 1.5 periods): an arm publishing at exactly 20 Hz with DDS jitter got about 14 ticks/s,
since every early message was dropped and the next tick waited for the one after it.
"""

from __future__ import annotations

from dataclasses import dataclass

# An arm message is early by at most this fraction of a period to still start the tick due.
EARLY_FRACTION = 0.5
# The timer covers a silence: it ticks once the due time is this fraction of a period past.
LATE_FRACTION = 0.5
# How much of a message's offset from its due time moves the schedule's phase (a phase-locked
# loop: the schedule settles on the arm's mean phase, wherever the first message fell).
PHASE_GAIN = 0.2
# Two arm-driven ticks are at least this fraction of a period apart (a burst is not a tick each).
MIN_GAP_FRACTION = 0.25
# A tick this many periods after the previous one was an overrun (the arm or the host was late).
OVERRUN_PERIODS = 1.5


@dataclass
class TickSchedule:
    """The adapter's tick schedule for one arm (``period_s`` = 1 / control_rate_hz).

    Due times lie on a grid ``anchor + k * period_s``, shifted by ``phase`` (bounded by half a
    period): each tick taken moves one grid step, so over any stretch the ticks are at most the
    control rate, and the phase follows the arm's mean phase without changing that rate.
    """

    period_s: float
    anchor: float | None = None  # monotonic time of the grid's origin (None: no tick yet)
    steps: int = 0  # ticks taken since the anchor
    phase: float = 0.0  # the arm's mean offset from the grid, s, |phase| <= period / 2
    last: float | None = None  # monotonic time of the last tick taken
    overruns: int = 0  # arm-driven ticks later than OVERRUN_PERIODS after the last

    def __post_init__(self) -> None:
        if not self.period_s > 0:
            raise ValueError(f"tick period must be > 0 s, got {self.period_s!r}")

    @property
    def due(self) -> float | None:
        """Monotonic time the next tick is due (None before the first)."""
        return (
            None if self.anchor is None else self.anchor + self.steps * self.period_s + self.phase
        )

    def take(self, now: float, from_timer: bool) -> bool:
        """Whether a tick starts at ``now`` (an arm message, or the timer when ``from_timer``).

        When it does, the schedule moves on; when it does not, nothing changes.
        """
        p, due = self.period_s, self.due
        if due is not None:
            if from_timer and now < due + LATE_FRACTION * p:
                return False  # the arm drives the ticks; the timer only covers its silences
            if not from_timer and (
                now < due - EARLY_FRACTION * p or now - self.last < MIN_GAP_FRACTION * p
            ):
                return False  # too early for the next tick: at most the control rate
        if not from_timer and self.last is not None and now - self.last > OVERRUN_PERIODS * p:
            self.overruns += 1
        if due is None or from_timer or now > due + LATE_FRACTION * p:
            # First tick, a silence covered by the timer, or the arm back after one: a new grid
            # from now (the timer's own cadence keeps silent ticks at one per timer period).
            self.anchor, self.steps, self.phase = now, (0 if from_timer else 1), 0.0
        else:
            # Within half a period of its due time: one grid step, the phase nudged towards the
            # arm's, so one late message does not drop the next.
            half = 0.5 * p
            self.phase = min(half, max(-half, self.phase + PHASE_GAIN * (now - due)))
            self.steps += 1
        self.last = now
        return True
