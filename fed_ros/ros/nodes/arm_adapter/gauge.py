"""The arm adapter's ``/diagnostics`` reading: its safety counters and episode state.

Reads the collaborators the node hands it (never the node): its lock, the safety filter, the
episode and the check of which arm topics are missing.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from fed_ros.core import diagnostics as D


class AdapterGauge:
    """Arm adapter safety counters -> Status (a watchdog trip in the last period is WARN)."""

    def __init__(
        self,
        name: str,
        profile: str,
        *,
        lock: threading.RLock,
        safety: Any,
        episode: Any,
        missing: Callable[[], list[str]],
        lockstep: bool,
    ) -> None:
        self.name, self.profile = name, profile
        self.lock, self.safety, self.episode = lock, safety, episode
        self.missing, self.lockstep = missing, lockstep
        self._window = D.TripWindow()

    def __call__(self) -> D.Status:
        safety, episode = self.safety, self.episode
        with self.lock:
            c, trips = safety.counters, safety.watchdog.trips
            now = time.monotonic()
            reading = D.AdapterReading(
                watchdog_trips=trips,
                recent_trips=self._window.grew("trips", trips),
                clipped_values=c.clipped_values,
                clipped_commands=c.clipped_commands,
                workspace_limited=c.workspace_limited,
                rejected=c.rejected,
                held_ticks=c.held_ticks,
                hold=safety.hold_requested,
                missing=self.missing(),
                episode=episode.number,
                step=episode.step,
                done=episode.done,
                lockstep=self.lockstep,
                # An episode running without policy commands: the watchdog holds the arm now.
                watchdog_holding=bool(
                    not episode.done
                    and episode.number > 0
                    and not safety.hold_requested
                    and safety.watchdog.silent(now)
                ),
                human_control=episode.control.human_active(now),
                interventions=episode.control.interventions,
                dropped_for_human=episode.control.dropped,
            )
        return D.adapter_status(self.name, self.profile, reading)
