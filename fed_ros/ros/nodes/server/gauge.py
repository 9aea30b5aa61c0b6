"""The server node's ``/diagnostics`` reading: round, roster and update counters.

Reads the collaborators the node hands it (never the node): the round coordinator, the live
parameters, the update intake and the cluster-model publisher.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fed_ros.core import diagnostics as D


class ServerGauge:
    """Server counters -> Status; rejections summed over the run's stage collectors."""

    def __init__(
        self, name: str, *, coord: Any, params: Callable[[], Any], intake: Any, models: Any
    ) -> None:
        self.name = name
        self.coord, self.params, self.intake, self.models = coord, params, intake, models
        self._collector: Any = None
        self._closed_rejected = 0
        self._last_rejection = ""

    def __call__(self) -> D.Status:
        coord = self.coord
        col = coord.collector
        if col is not self._collector:
            if self._collector is not None:
                self._closed_rejected += self._collector.rejected
            self._collector = col
        if col is not None and col.rejections:
            rid, reason = col.rejections[-1]
            self._last_rejection = f"{rid}: {reason}"[:300]
        plan = coord.current_plan
        p = self.params()
        expected = len(p.robots_expected) if p.robots_expected else int(p.min_robots)
        held = bool(coord.held and coord.paused)  # a round closed, the next waits for the resume
        return D.server_status(
            self.name,
            D.ServerReading(
                round_idx=int(coord.round_idx),
                stage=plan.stage if plan else ("paused" if held else "waiting"),
                robots_registered=len(coord.roster),
                robots_expected=expected,
                accepted=int(self.intake.completed),
                rejected=self._closed_rejected + (col.rejected if col is not None else 0),
                last_rejection=self._last_rejection,
                done=bool(coord.finished),
                rounds_enabled=not coord.paused,
                held=held,
                ending=bool(coord.end_requested),
                resend_refused=int(self.models.resend_refused),
            ),
        )
