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

from rclpy.parameter import Parameter

PARAMETER = "rounds_enabled"
# Bound on waiting for the robots to acknowledge STAGE_DONE before a clean exit.
DONE_ACK_TIMEOUT_S = 5.0


class RoundsGate:
    """Follows the ``rounds_enabled`` parameter; offers ``~/set_rounds`` and ``~/end_fleet``."""

    def __init__(self, node, enabled: bool, callback_group=None) -> None:
        from std_srvs.srv import SetBool, Trigger

        self.node = node
        node.coord.paused = not enabled
        if not enabled:
            node.get_logger().warning(
                "rounds DISABLED (rounds_enabled false): no round is announced until it is set true"
            )
        node.add_post_set_parameters_callback(self._after_set)
        node.create_service(
            SetBool, "~/set_rounds", self._on_set_rounds, callback_group=callback_group
        )
        node.create_service(
            Trigger, "~/end_fleet", self._on_end_fleet, callback_group=callback_group
        )

    @property
    def enabled(self) -> bool:
        """Whether the server may announce new rounds now."""
        return not self.node.coord.paused

    def _after_set(self, params) -> None:
        for p in params:
            if p.name == PARAMETER:
                coord = self.node.coord
                coord.paused = not bool(p.value)
                if p.value:
                    self.node.get_logger().warning(
                        "rounds ENABLED: "
                        + (
                            f"announcing round {coord.round_idx}"
                            if coord.held
                            else "the next round is announced when due"
                        )
                    )
                else:
                    self.node.get_logger().warning(
                        "rounds DISABLED (paused): the round in progress finishes; no new round is "
                        "announced until rounds_enabled is true"
                    )

    def _on_set_rounds(self, request, response):
        result = self.node.set_parameters(
            [Parameter(PARAMETER, Parameter.Type.BOOL, bool(request.data))]
        )[0]
        response.success = bool(result.successful)
        response.message = (
            f"rounds {'enabled' if request.data else 'paused'}"
            if result.successful
            else result.reason
        )
        return response

    def _on_end_fleet(self, request, response):
        coord = self.node.coord
        coord.end_requested = True
        # The server exits 0 once STAGE_DONE is out, as after the last round with exit_when_done
        # (set through the parameter, so `ros2 param get` shows it; also ends a server that stays
        # up).
        self.node.set_parameters([Parameter("exit_when_done", Parameter.Type.BOOL, True)])
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
        self.node.get_logger().warning(f"end_fleet: {response.message}")
        return response

    def after_round(self, plan) -> None:
        """A round closed: say so when the pause held the next one back."""
        if plan is None and self.node.coord.held and self.node.coord.paused:
            self.node.get_logger().warning(
                f"rounds paused: round {self.node.coord.round_idx} is not announced "
                "until rounds_enabled is true"
            )

    def deliver_done(self, timeout_s: float = DONE_ACK_TIMEOUT_S) -> None:
        """Before the exit 0 after STAGE_DONE (not on Ctrl-C), wait (bounded) until the robots'
        readers acknowledged the announcement, so the last thing they see is the end of the
        federation."""
        if self.node.exit_code == 0 and self.node.coord.finished:
            from rclpy.duration import Duration

            if not self.node.announce_pub.wait_for_all_acked(Duration(seconds=timeout_s)):
                self.node.get_logger().warning(
                    f"STAGE_DONE not acknowledged by every robot within {timeout_s:.0f} s"
                )
