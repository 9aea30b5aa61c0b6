"""A training robot's liveness heartbeats (TrainingProgress, robot -> server).

While a TRAIN stage's local training runs, the robot tells the server how far it has got every
``heartbeat_period_s`` (and once more when every step is done: the update is on its way). The
server extends this robot's deadline while the steps advance, up to the fleet's cap
(fed_ros.core.rounds.liveness), so a robot on a slow onboard computer stays in the round instead
of being dropped as a straggler. Sent from the training thread between optimiser steps: a robot
stuck inside one step sends nothing and its extension runs out, which is the point.

Signed like an update when the robot has a key; the sequence number rises with every heartbeat
of a round, so a replayed heartbeat is refused without a nonce.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any


class TrainingHeartbeat:
    """Publishes TrainingProgress for one robot; ``period_s()`` is read live (0 = off).

    Collaborators: ``publish(msg)`` (the fleet topic), ``make_msg(**fields)`` (the message type),
    ``signer`` (None: unsigned), ``clock`` (monotonic seconds).
    """

    def __init__(
        self,
        robot_id: str,
        publish: Callable[[Any], None],
        make_msg: Callable[..., Any],
        signer: Any,
        period_s: Callable[[], float],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.robot_id, self.publish, self.make_msg = robot_id, publish, make_msg
        self.signer, self.period_s, self.clock = signer, period_s, clock
        self.round_idx = -1
        self.expected_steps = 0
        self.seq = 0  # rises across rounds too: never reused while the process lives
        self.sent = 0
        self._last_sent = -float("inf")

    def start(self, round_idx: int, expected_steps: int) -> None:
        """Training of ``round_idx`` begins with ``expected_steps`` steps: say so at once."""
        self.round_idx, self.expected_steps = int(round_idx), int(expected_steps)
        self._last_sent = -float("inf")
        self.step(0)

    def step(self, steps_done: int) -> None:
        """After an optimiser step: send when a period has passed, or when training is done."""
        period = float(self.period_s())
        if period <= 0 or self.round_idx < 0:
            return
        now = self.clock()
        if now - self._last_sent < period and steps_done < self.expected_steps:
            return
        self._last_sent = now
        self.seq += 1
        steps_done = min(int(steps_done), self.expected_steps)
        signature = (
            b""
            if self.signer is None
            else self.signer.sign_progress(
                self.round_idx, self.robot_id, self.seq, steps_done, self.expected_steps
            )
        )
        self.publish(
            self.make_msg(
                robot_id=self.robot_id,
                round=self.round_idx,
                seq=self.seq,
                steps_done=steps_done,
                expected_steps=self.expected_steps,
                signature=list(signature),
            )
        )
        self.sent += 1
