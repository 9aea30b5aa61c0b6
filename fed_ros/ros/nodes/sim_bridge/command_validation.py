"""Which command the simulated arm applies: validation of an ``arm/command`` and the newest
valid one, stale after the command timeout.

The sim bridge accepts what this arm can do (OSC position deltas or a hold, 4-D with the
gripper) and refuses anything else with a reason; a rejected command clears the previous one,
so the arm holds still instead of repeating it. The rules are pure (no node, no clock of their
own) and are what a real driver's command checks must match, hence a module of their own.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from fed_ros.core.arm.safety import MODE_HOLD, MODE_JOINT_VELOCITY, MODE_OSC_POSE, MODE_OSC_POSITION
from fed_ros.core.data.episode import ACTION_DIM
from fed_ros.ros.arm import topics as at

_MODE_NAMES = {
    MODE_OSC_POSITION: "OSC_POSITION",
    MODE_OSC_POSE: "OSC_POSE",
    MODE_JOINT_VELOCITY: "JOINT_VELOCITY",
    MODE_HOLD: "HOLD",
}


@dataclass(frozen=True)
class ValidCommand:
    """A command that passed validation: ``hold`` or an OSC position action."""

    action: np.ndarray  # (3,) float32, ignored when hold
    gripper: float
    hold: bool
    stamp_ns: int
    source: str


def validate_command(msg) -> ValidCommand:
    """Check an ArmCommand for this arm (OSC position, 4-D); ValueError names the problem."""
    mode = int(msg.mode)
    if mode not in (MODE_OSC_POSITION, MODE_HOLD):
        name = _MODE_NAMES.get(mode, "unknown")
        raise ValueError(
            f"mode {mode} ({name}) is not supported by this arm "
            f"(supported: {MODE_OSC_POSITION} OSC_POSITION, {MODE_HOLD} HOLD)"
        )
    gripper = float(msg.gripper)
    if not np.isfinite(gripper) or not -1.0 <= gripper <= 1.0:
        raise ValueError(f"gripper {gripper!r} is not a finite value in [-1, 1]")
    action = np.asarray(msg.action, dtype=np.float32)
    stamp_ns = at.stamp_to_ns(msg.header.stamp)
    if mode == MODE_HOLD:
        return ValidCommand(
            np.zeros(ACTION_DIM - 1, np.float32), gripper, True, stamp_ns, msg.source
        )
    if action.shape != (ACTION_DIM - 1,):
        raise ValueError(
            f"action has {action.size} values, expected {ACTION_DIM - 1} (OSC position dx, dy, dz)"
        )
    if not np.all(np.isfinite(action)):
        raise ValueError(f"action contains NaN/Inf: {action.tolist()}")
    if np.any(np.abs(action) > 1.0):
        raise ValueError(f"action {action.tolist()} is outside [-1, 1]")
    return ValidCommand(action, gripper, False, stamp_ns, msg.source)


class LatestCommand:
    """The newest valid command and when it arrived (zero-order hold with a timeout).

    ``current(now_ns)`` is the command a tick applies: none after a rejection or a reset, nor
    once it is older than ``timeout_ns`` (the arm then holds still).
    """

    def __init__(self, timeout_ns: int) -> None:
        self.timeout_ns = timeout_ns
        self.command: ValidCommand | None = None
        self.received_ns = 0
        self.rejected = 0

    def accept(self, command: ValidCommand, now_ns: int) -> None:
        """A valid command arrived at ``now_ns`` (monotonic)."""
        self.command = command
        self.received_ns = now_ns

    def reject(self) -> int:
        """A command failed validation: forget the last one; returns the rejections so far."""
        self.rejected += 1
        # Hold still until a valid command arrives: never keep executing the last one.
        self.command = None
        return self.rejected

    def clear(self) -> None:
        """A new episode: no command carries over."""
        self.command = None

    def current(self, now_ns: int) -> ValidCommand | None:
        """The command to apply at ``now_ns`` (monotonic), or None to hold still."""
        command = self.command
        if command is None:
            return None
        if now_ns - self.received_ns > self.timeout_ns:
            return None
        return command
