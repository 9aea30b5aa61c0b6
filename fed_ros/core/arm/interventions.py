"""Who drives the arm, the policy or a human, and how often the human had to step in.

Human-gated DAgger as in Fleet-DAgger / physical-IFL (issue 24, item 5): while a policy runs,
the operator's deadman hands control to the human; releasing it hands control back. The arm
adapter asks a :class:`ControlArbiter` about every command it receives:

* a teleop command that moves (any mode but HOLD) takes control for the human at once;
* while the human has control, every other command (the policy's, an expert's) is dropped,
  so the arm never gets two drivers' commands interleaved;
* the human hands back with a teleop HOLD (the teleop node sends one when the deadman is
  released, when its device goes stale or sends bad input, and when it shuts down), or by
  silence: no teleop command for ``handback_s`` (a teleop node that died while its deadman
  was held). The arm adapter's own watchdog still stops the arm when nobody commands it;
* a takeover that silence ended and whose teleop comes back within ``rejoin_s`` of its last
  command (no release in between) is the same intervention: the deadman was held all along
  and only the stream stalled (a loaded operator laptop, a lossy link). Control still went
  back to the policy during the gap, and the gap is not counted as human time;
* a new episode starts with the policy in control.

The arbiter also keeps the episode's intervention count (takeovers) and human seconds, which
the adapter publishes in each EpisodeStatus, and :class:`InterventionTally` sums them over
the episodes of an evaluation into the rates the fleet reports (interventions per episode,
human seconds per episode). ROS-free and clock-free: every method takes ``now_s``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

TELEOP_SOURCE = "teleop"
INTERVENTION_SOURCE = "intervention"  # a recording of a human's corrective segment
DEFAULT_HANDBACK_S = 0.5  # teleop silence that hands control back (teleop publishes at 20 Hz)
DEFAULT_REJOIN_S = 3.0  # a stalled stream resuming within this is the same takeover


def is_teleop(source: str) -> bool:
    """Whether a command's ``source`` field names a human at a teleop device."""
    return source == TELEOP_SOURCE or source.startswith(TELEOP_SOURCE + ":")


class ControlArbiter:
    """Arbitration between the policy and a human for one arm (see the module docstring)."""

    def __init__(
        self, handback_s: float = DEFAULT_HANDBACK_S, rejoin_s: float = DEFAULT_REJOIN_S
    ) -> None:
        for name, value in (("handback_s", handback_s), ("rejoin_s", rejoin_s)):
            if not (isinstance(value, (int, float)) and math.isfinite(value)):
                raise ValueError(f"{name} must be a finite number, got {value!r}")
            if value <= 0:
                raise ValueError(f"{name} must be > 0, got {value!r}")
        self.handback_s = float(handback_s)
        self.rejoin_s = float(rejoin_s)
        self._human_since: float | None = None  # when the current takeover began
        self._human_last = 0.0  # the newest teleop command of the current takeover
        # The last teleop command of a takeover that silence (not a release) ended: a moving
        # command soon after it continues that intervention instead of counting a new one.
        self._silenced_at: float | None = None
        self.interventions = 0  # takeovers in the current episode
        self._human_s = 0.0  # closed takeovers' seconds in the current episode
        self.dropped = 0  # other drivers' commands dropped while the human had control

    def human_active(self, now_s: float) -> bool:
        """Whether the human has control now (ends a takeover whose teleop went silent)."""
        if self._human_since is not None and now_s - self._human_last > self.handback_s:
            self._end(self._human_last)
            self._silenced_at = self._human_last
        return self._human_since is not None

    def admit(self, source: str, hold: bool, now_s: float) -> bool:
        """Whether a command from ``source`` (``hold``: a HOLD-mode command) may drive the arm."""
        if is_teleop(source):
            if hold:
                if self.human_active(now_s):
                    self._end(now_s)  # the deadman released: control back to the policy
                self._silenced_at = None  # a release: the next takeover is a new one
                return True  # a human's HOLD always stops the arm
            if not self.human_active(now_s):
                stalled = (
                    self._silenced_at is not None and now_s - self._silenced_at <= self.rejoin_s
                )
                self._human_since = now_s
                self.interventions += 0 if stalled else 1
            self._silenced_at = None
            self._human_last = now_s
            return True
        if self.human_active(now_s):
            self.dropped += 1
            return False
        return True

    def human_seconds(self, now_s: float) -> float:
        """Seconds the human has had control in the current episode (an open takeover counts)."""
        open_s = 0.0
        if self.human_active(now_s) and self._human_since is not None:
            open_s = now_s - self._human_since
        return self._human_s + open_s

    def new_episode(self, now_s: float) -> tuple[int, float]:
        """Start an episode with the policy in control; returns the last one's
        (interventions, human seconds)."""
        done = (self.interventions, self.human_seconds(now_s))
        self._human_since = self._silenced_at = None
        self.interventions, self._human_s = 0, 0.0
        return done

    def _end(self, at_s: float) -> None:
        if self._human_since is not None:
            self._human_s += max(0.0, at_s - self._human_since)
        self._human_since = None


@dataclass
class InterventionTally:
    """Interventions over the episodes of one evaluation (or a robot's lifetime)."""

    episodes: int = 0
    interventions: int = 0
    human_seconds: float = 0.0

    def add_episode(self, interventions: int, human_seconds: float) -> None:
        if interventions < 0 or not (math.isfinite(human_seconds) and human_seconds >= 0):
            raise ValueError(
                f"an episode's interventions and human seconds must be >= 0, got "
                f"{interventions!r}, {human_seconds!r}"
            )
        self.episodes += 1
        self.interventions += int(interventions)
        self.human_seconds += float(human_seconds)

    @property
    def per_episode(self) -> float:
        """Interventions per episode (0 before any episode)."""
        return self.interventions / self.episodes if self.episodes else 0.0

    @property
    def human_seconds_per_episode(self) -> float:
        return self.human_seconds / self.episodes if self.episodes else 0.0

    def summary(self) -> dict[str, float]:
        return {
            "episodes": self.episodes,
            "interventions_per_episode": round(self.per_episode, 4),
            "human_seconds_per_episode": round(self.human_seconds_per_episode, 3),
        }
