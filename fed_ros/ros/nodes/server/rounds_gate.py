"""When the fleet server may start rounds: ``rounds_enabled`` (parameter + ``~/set_rounds``) and
``~/end_fleet``.

The server's counterpart of the robot's learning gate (learning_gate.py). With
``rounds_enabled`` false the server finishes the round in progress (collects, aggregates,
commits, evaluates when due, publishes models and report) but announces no new round, nor a
re-attempt of an abandoned one; set true again, it announces the next round with a fresh
deadline (a pause between rounds never expires one). Starting with it false, the server
registers robots but waits before round 0. Set it with
``ros2 param set /fleet/server rounds_enabled false`` or the std_srvs/SetBool service
``/fleet/server/set_rounds``.

``/fleet/server/end_fleet`` (std_srvs/Trigger) ends the federation after the round in
progress, as after the last round: the round commits, robots are told STAGE_DONE and the
server exits 0 (whatever ``exit_when_done`` says). A pause in force does not delay it.
The state machine lives in :class:`fed_ros.core.rounds.coordinator.RoundCoordinator` (``paused``,
``held``, ``end_requested``); this module only turns parameters and services into it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from rclpy.parameter import Parameter

PARAMETER = "rounds_enabled"
# Bound on waiting for the robots to acknowledge STAGE_DONE before a clean exit.
DONE_ACK_TIMEOUT_S = 5.0


class RoundsGate:
    """Follows the ``rounds_enabled`` parameter and answers ``~/set_rounds`` and ``~/end_fleet``.

    Collaborators: ``coord`` the round state machine it pauses and ends, ``log`` the node's
    logger, ``set_parameter(param)`` sets one of the node's parameters (returns its
    SetParametersResult), ``exit_code()`` the server's decided exit code (None while serving),
    ``announce_pub`` the announcement publisher whose STAGE_DONE must be acknowledged. The node
    registers ``after_set`` as a post-set-parameters callback and the two services' handlers.
    """

    def __init__(
        self,
        coord,
        enabled: bool,
        *,
        log,
        set_parameter: Callable[[Parameter], Any],
        exit_code: Callable[[], int | None],
        announce_pub,
    ) -> None:
        self.coord, self.log, self.set_parameter = coord, log, set_parameter
        self.exit_code, self.announce_pub = exit_code, announce_pub
        coord.paused = not enabled
        if not enabled:
            log.warning(
                "rounds DISABLED (rounds_enabled false): no round is announced until it is set true"
            )

    @property
    def enabled(self) -> bool:
        """Whether the server may announce new rounds now."""
        return not self.coord.paused

    def after_set(self, params) -> None:
        for p in params:
            if p.name == PARAMETER:
                coord = self.coord
                coord.paused = not bool(p.value)
                if p.value:
                    self.log.warning(
                        "rounds ENABLED: "
                        + (
                            f"announcing round {coord.round_idx}"
                            if coord.held
                            else "the next round is announced when due"
                        )
                    )
                else:
                    self.log.warning(
                        "rounds DISABLED (paused): the round in progress finishes; no new round is "
                        "announced until rounds_enabled is true"
                    )

    def on_set_rounds(self, request, response):
        result = self.set_parameter(Parameter(PARAMETER, Parameter.Type.BOOL, bool(request.data)))
        response.success = bool(result.successful)
        response.message = (
            f"rounds {'enabled' if request.data else 'paused'}"
            if result.successful
            else result.reason
        )
        return response

    def on_end_fleet(self, request, response):
        coord = self.coord
        coord.end_requested = True
        # The server exits 0 once STAGE_DONE is out, as after the last round with exit_when_done
        # (set through the parameter, so `ros2 param get` shows it; also ends a server that stays
        # up).
        self.set_parameter(Parameter("exit_when_done", Parameter.Type.BOOL, True))
        where = (
            "federation already finished"
            if coord.finished
            else f"round {coord.current_plan.round_idx} {coord.current_plan.stage} in progress"
            if coord.collector is not None
            else f"no round in progress (next: {coord.round_idx})"
        )
        response.success, response.message = (
            True,
            f"ending the federation after the current round: {where}",
        )
        self.log.warning(f"end_fleet: {response.message}")
        return response

    def after_round(self, plan) -> None:
        """A round closed: say so when the pause held the next one back."""
        if plan is None and self.coord.held and self.coord.paused:
            self.log.warning(
                f"rounds paused: round {self.coord.round_idx} is not announced "
                "until rounds_enabled is true"
            )

    def deliver_done(self, timeout_s: float = DONE_ACK_TIMEOUT_S) -> None:
        """Before the exit 0 after STAGE_DONE (not on Ctrl-C), wait (bounded) until the robots'
        readers acknowledged the announcement, so the last thing they see is the end of the
        federation."""
        if self.exit_code() == 0 and self.coord.finished:
            from rclpy.duration import Duration

            if not self.announce_pub.wait_for_all_acked(Duration(seconds=timeout_s)):
                self.log.warning(
                    f"STAGE_DONE not acknowledged by every robot within {timeout_s:.0f} s"
                )
