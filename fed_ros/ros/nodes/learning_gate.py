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
from typing import Callable

from rclpy.parameter import Parameter

PARAMETER = "learning_enabled"


class LearningGate:
    """Follows the ``learning_enabled`` parameter; offers ``~/set_learning``."""

    def __init__(
        self,
        node,
        enabled: bool,
        callback_group=None,
        on_change: Callable[[bool], None] | None = None,
    ) -> None:
        from std_srvs.srv import SetBool

        self.node = node
        self._on_change = on_change
        self._on = threading.Event()
        self._set(enabled)
        node.add_post_set_parameters_callback(self._after_set)
        node.create_service(
            SetBool, "~/set_learning", self._on_set_learning, callback_group=callback_group
        )

    @property
    def enabled(self) -> bool:
        """Whether the robot may train, collect and evaluate now."""
        return self._on.is_set()

    def _set(self, on: bool) -> None:
        if on:
            self._on.set()
        else:
            self._on.clear()

    def _after_set(self, params) -> None:
        for p in params:
            if p.name == PARAMETER:
                # Off: the gate closes, then the arm is stopped; on: the arm client may drive
                # again before anyone waiting on the gate wakes up.
                if p.value and self._on_change is not None:
                    self._on_change(True)
                self._set(bool(p.value))
                if not p.value and self._on_change is not None:
                    self._on_change(False)
                self.node.get_logger().warning(
                    f"learning {'ENABLED' if p.value else 'DISABLED (gate off)'}"
                )

    def _on_set_learning(self, request, response):
        result = self.node.set_parameters(
            [Parameter(PARAMETER, Parameter.Type.BOOL, bool(request.data))]
        )[0]
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
            self.node.get_logger().info(
                "learning disabled: waiting for learning_enabled before collecting"
            )
        while not stop.is_set():
            if self._on.wait(poll_s):
                return True
        return False

    def skip(self, what: str) -> bool:
        """True (and logged) when the gate is off and ``what`` must not happen."""
        if self.enabled:
            return False
        self.node.get_logger().info(
            f"learning disabled: skipping {what}", throttle_duration_sec=5.0
        )
        return True
