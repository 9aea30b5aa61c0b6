"""When a robot node may act: the ``learning_enabled`` gate (parameter + ``~/set_learning``).

A lab keeps learning off while the arm does production work, pauses between rounds, and
allows training only when the arm is idle. While the gate is off the robot node trains,
collects and evaluates nothing: round announcements are skipped (the server sees the robot
as absent and its quorum rules decide), start-up demonstrations wait, and EvaluatePolicy is
refused. Switching off lets a training stage already running end, then the robot pauses; an
arm episode being driven (a demonstration or an evaluation) is stopped at once instead:
``on_change(False)`` halts the robot's arm client, which sends the arm a HOLD after the policy's
last command (the arm must not keep executing a command nobody follows any more). Set it with
``ros2 param set /<robot>/robot learning_enabled false`` or the std_srvs/SetBool service
``/<robot>/robot/set_learning``.
"""

from __future__ import annotations

import threading
from typing import Any, Callable

from rclpy.parameter import Parameter

PARAMETER = "learning_enabled"


class LearningGate:
    """Follows the ``learning_enabled`` parameter and answers ``~/set_learning``.

    Collaborators: ``log`` the node's logger, ``set_parameter(param)`` sets one of the node's
    parameters (returns its SetParametersResult), ``on_change(on)`` runs on every switch. The
    node registers ``after_set`` as a post-set-parameters callback and ``on_set_learning`` as
    the service's handler.
    """

    def __init__(
        self,
        enabled: bool,
        *,
        log,
        set_parameter: Callable[[Parameter], Any],
        on_change: Callable[[bool], None] | None = None,
    ) -> None:
        self.log, self.set_parameter = log, set_parameter
        self._on_change = on_change
        self._on = threading.Event()
        self._set(enabled)

    @property
    def enabled(self) -> bool:
        """Whether the robot may train, collect and evaluate now."""
        return self._on.is_set()

    def _set(self, on: bool) -> None:
        if on:
            self._on.set()
        else:
            self._on.clear()

    def after_set(self, params) -> None:
        for p in params:
            if p.name == PARAMETER:
                # Off: the gate closes, then the arm is stopped; on: the arm client may drive
                # again before anyone waiting on the gate wakes up.
                if p.value and self._on_change is not None:
                    self._on_change(True)
                self._set(bool(p.value))
                if not p.value and self._on_change is not None:
                    self._on_change(False)
                self.log.warning(f"learning {'ENABLED' if p.value else 'DISABLED (gate off)'}")

    def on_set_learning(self, request, response):
        result = self.set_parameter(Parameter(PARAMETER, Parameter.Type.BOOL, bool(request.data)))
        response.success = bool(result.successful)
        response.message = (
            f"learning {'enabled' if request.data else 'disabled'}"
            if result.successful
            else result.reason
        )
        return response

    def wait(self, stop: threading.Event, poll_s: float = 0.5) -> bool:
        """Block until the gate is on (True) or ``stop`` is set (False)."""
        if not self.enabled:
            self.log.info("learning disabled: waiting for learning_enabled before collecting")
        while not stop.is_set():
            if self._on.wait(poll_s):
                return True
        return False

    def skip(self, what: str) -> bool:
        """True (and logged) when the gate is off and ``what`` must not happen."""
        if self.enabled:
            return False
        self.log.info(f"learning disabled: skipping {what}", throttle_duration_sec=5.0)
        return True
