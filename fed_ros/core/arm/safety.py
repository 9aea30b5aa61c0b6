"""The arm adapter's pure logic: joint selection, scaling, clipping, workspace box, watchdog, hold.

ROS-free (numpy only) so every safety rule is unit-tested without DDS; the adapter node
(``fed_ros.ros.nodes.arm_adapter.arm_adapter_node``) converts messages and calls
:class:`SafetyFilter` once per control tick.

Scaling (stated, configurable in the profile's ``limits``): a normalised end-effector delta
``d`` in [-1, 1] becomes a twist ``v = d * max_linear_speed`` (m/s) and
``w = d * max_angular_speed`` (rad/s), held for one control period, i.e. a displacement of
``d * max_linear_speed / control_rate_hz`` metres per tick. Joint velocity actions become
``a * velocity_limit`` (rad/s) per joint. The gripper action ``g`` in [-1 (open), 1 (closed)]
becomes the position ``open + (g + 1) / 2 * (closed - open)``.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from dataclasses import dataclass, field

import numpy as np
from numpy.typing import ArrayLike, NDArray

from fed_ros.core.arm.profile import ArmProfile, GripperConfig, LimitsConfig

# fed_ros/ArmCommand modes (msg/ArmCommand.msg); kept as literals so this stays ROS-free.
MODE_OSC_POSITION = 0
MODE_OSC_POSE = 1
MODE_JOINT_VELOCITY = 2
MODE_HOLD = 3


class JointSelector:
    """Picks the profile's joints, in the profile's order, out of a full JointState."""

    def __init__(self, wanted: tuple[str, ...] | list[str]) -> None:
        self.wanted = tuple(wanted)
        self._names: tuple[str, ...] = ()
        self._index: NDArray[Any] | None = None

    def select(
        self, names: Iterable[str], positions: ArrayLike, velocities: ArrayLike = ()
    ) -> tuple[NDArray[Any], NDArray[Any]]:
        """(positions, velocities) of the wanted joints; ValueError names any that are missing."""
        names = tuple(names)
        if names != self._names:  # joint_state_broadcaster keeps one order: cache the map
            lookup = {n: i for i, n in enumerate(names)}
            missing = [n for n in self.wanted if n not in lookup]
            if missing:
                raise ValueError(f"joint state lacks joint(s) {missing} (it has {list(names)})")
            self._names, self._index = names, np.array([lookup[n] for n in self.wanted], dtype=int)
        pos = np.asarray(positions, dtype=np.float64)
        if pos.shape != (len(names),):
            raise ValueError(f"joint state has {pos.size} positions for {len(names)} names")
        vel = np.asarray(velocities, dtype=np.float64)
        vel = vel[self._index] if vel.shape == (len(names),) else np.zeros(len(self.wanted))
        return pos[self._index], vel


class Watchdog:
    """Expires when no command was fed for ``timeout_s``; counts each expiry once."""

    def __init__(self, timeout_s: float) -> None:
        if not timeout_s > 0:
            raise ValueError(f"watchdog timeout must be > 0, got {timeout_s!r}")
        self.timeout_s = timeout_s
        self._last: float | None = None
        self._tripped = True  # nothing received yet: holding, but not counted as a trip
        self.trips = 0

    def feed(self, now_s: float) -> None:
        """A fresh command arrived at ``now_s``."""
        self._last = now_s
        self._tripped = False

    def silent(self, now_s: float) -> bool:
        """Whether the last command is older than the timeout, without counting a trip (for
        reports)."""
        return self._last is None or now_s - self._last > self.timeout_s

    def expired(self, now_s: float) -> bool:
        """True when the last command is older than the timeout (or none came yet)."""
        if self._last is None or now_s - self._last > self.timeout_s:
            if not self._tripped:
                self._tripped = True
                self.trips += 1
            return True
        return False


def clip_unit(values: NDArray[Any]) -> tuple[NDArray[Any], int]:
    """Clip to [-1, 1]; returns (clipped, number of values that were outside)."""
    values = np.asarray(values, dtype=np.float64)
    outside = int(np.count_nonzero(np.abs(values) > 1.0))
    return np.clip(values, -1.0, 1.0), outside


def twist_from_delta(
    delta: NDArray[Any], limits: LimitsConfig
) -> tuple[NDArray[Any], NDArray[Any]]:
    """Normalised (3,) or (6,) delta -> (linear m/s, angular rad/s)."""
    delta = np.asarray(delta, dtype=np.float64)
    linear = delta[:3] * limits.max_linear_speed
    angular = delta[3:6] * limits.max_angular_speed if delta.size >= 6 else np.zeros(3)
    return linear, angular


def enforce_workspace(
    position: NDArray[Any],
    linear: NDArray[Any],
    period_s: float,
    lo: ArrayLike,
    hi: ArrayLike,
) -> tuple[NDArray[Any], bool]:
    """Limit ``linear`` so one period of motion does not leave the box [lo, hi].

    Motion back into the box is allowed; the arm is never pushed actively (an arm outside
    the box may only move towards it). Returns (linear, whether any axis was limited).
    """
    p = np.asarray(position, dtype=np.float64)
    v = np.array(linear, dtype=np.float64)
    lo, hi = np.asarray(lo, dtype=np.float64), np.asarray(hi, dtype=np.float64)
    upper = np.maximum(0.0, (hi - p) / period_s)  # fastest allowed speed towards +axis
    lower = np.minimum(0.0, (lo - p) / period_s)  # fastest allowed speed towards -axis
    limited = np.clip(v, lower, upper)
    return limited, bool(np.any(limited != v))


def gripper_position(g: float, cfg: GripperConfig) -> float:
    """Gripper action in [-1, 1] -> command position."""
    return cfg.open + (float(g) + 1.0) / 2.0 * (cfg.closed - cfg.open)


def gripper_action(position: float, cfg: GripperConfig) -> float:
    """Inverse of :func:`gripper_position` (the simulated arm's side)."""
    return float(np.clip(2.0 * (position - cfg.open) / (cfg.closed - cfg.open) - 1.0, -1.0, 1.0))


@dataclass
class SafetyCounters:
    """What the safety layer did so far (reported in diagnostics and logs)."""

    clipped_values: int = 0  # action / gripper values outside [-1, 1]
    clipped_commands: int = 0  # commands with at least one clipped value
    workspace_limited: int = 0  # ticks whose twist the workspace box limited
    rejected: int = 0  # commands refused (NaN, wrong size, unsupported mode)
    held_ticks: int = 0  # ticks that sent a zero twist (watchdog, hold, no state)


@dataclass
class TickOutput:
    """What one control tick sends to the arm and records as applied."""

    kind: str  # "twist" | "joint" | "hold"
    linear: NDArray[Any] = field(default_factory=lambda: np.zeros(3))
    angular: NDArray[Any] = field(default_factory=lambda: np.zeros(3))
    joint_velocities: NDArray[Any] | None = None
    gripper: float | None = None  # normalised gripper to send (None: leave it where it is)
    applied_action: NDArray[Any] = field(default_factory=lambda: np.zeros(3, np.float32))
    applied_gripper: float = -1.0
    applied_mode: int = MODE_HOLD
    reason: str = ""  # why it held


@dataclass
class _Command:
    action: NDArray[Any]
    gripper: float
    mode: int


class SafetyFilter:
    """Per-tick safety: validate and clip commands, watchdog, workspace box, hold latch."""

    def __init__(self, profile: ArmProfile) -> None:
        self.profile = profile
        self.limits = profile.limits
        self.watchdog = Watchdog(profile.watchdog_timeout_s)
        self.counters = SafetyCounters()
        self.hold_requested = False  # e-stop / hold latch: set and cleared explicitly
        self._command: _Command | None = None
        self._gripper = -1.0  # last gripper sent (robosuite and most drivers start open)

    def command(self, action: ArrayLike, gripper: float, mode: int, now_s: float) -> str:
        """Take a policy command; returns "" or the reason it was refused (then the arm holds)."""
        if self.hold_requested:
            return "hold requested"  # ignored, not stored: a release waits for a fresh command
        n_joints = len(self.profile.joints.names)
        sizes = {
            MODE_OSC_POSITION: 3,
            MODE_OSC_POSE: 6,
            MODE_JOINT_VELOCITY: n_joints,
            MODE_HOLD: None,
        }
        reason = ""
        values = np.asarray(action, dtype=np.float64).reshape(-1)
        if mode not in sizes:
            reason = f"mode {mode} is not one of {sorted(sizes)}"
        elif sizes[mode] is not None and values.size != sizes[mode]:
            reason = f"mode {mode} needs {sizes[mode]} action values, got {values.size}"
        elif not (np.all(np.isfinite(values)) and np.isfinite(gripper)):
            reason = f"non-finite action {values.tolist()} / gripper {gripper!r}"
        if reason:
            self.counters.rejected += 1
            self._command = None  # never keep executing an older command after a bad one
            return reason
        clipped, n_out = clip_unit(values)
        g, g_out = clip_unit(np.array([gripper]))
        if n_out + g_out:
            self.counters.clipped_values += n_out + g_out
            self.counters.clipped_commands += 1
        self._command = _Command(clipped, float(g[0]), int(mode))
        self.watchdog.feed(now_s)
        return ""

    @property
    def last_gripper(self) -> float:
        """The normalised gripper command last sent (where a hold keeps the gripper)."""
        return self._gripper

    def hold(self, on: bool) -> None:
        """Set or release the hold latch (e-stop topic); takes effect at the next tick."""
        self.hold_requested = bool(on)
        if on:
            self._command = None  # a release must not resume a command from before the hold

    def tick(self, now_s: float, eef_position: NDArray[Any] | None) -> TickOutput:
        """The command to send this tick (a zero twist when anything says hold)."""
        expired = self.watchdog.expired(now_s)
        cmd = self._command
        reason = (
            "hold requested"
            if self.hold_requested
            else "no valid command"
            if cmd is None
            else f"watchdog: no command for {self.watchdog.timeout_s:g} s"
            if expired
            else "policy sent HOLD"
            if cmd.mode == MODE_HOLD
            else ""
        )
        if (
            not reason
            and cmd is not None
            and cmd.mode != MODE_JOINT_VELOCITY
            and eef_position is None
        ):
            reason = "end-effector pose unknown (workspace box cannot be enforced)"
        if reason or cmd is None:  # no command always comes with a reason
            self.counters.held_ticks += 1
            return TickOutput("hold", applied_gripper=self._gripper, reason=reason)
        self._gripper = cmd.gripper
        if cmd.mode == MODE_JOINT_VELOCITY:
            limits = np.asarray(self.profile.joints.velocity_limits)
            return TickOutput(
                "joint",
                joint_velocities=cmd.action * limits,
                gripper=cmd.gripper,
                applied_action=cmd.action.astype(np.float32),
                applied_gripper=cmd.gripper,
                applied_mode=cmd.mode,
            )
        assert eef_position is not None  # held above: no pose, no twist
        linear, angular = twist_from_delta(cmd.action, self.limits)
        linear, limited = enforce_workspace(
            eef_position,
            linear,
            self.profile.period_s,
            self.limits.workspace_min,
            self.limits.workspace_max,
        )
        if limited:
            self.counters.workspace_limited += 1
        applied = cmd.action.copy()
        applied[:3] = linear / self.limits.max_linear_speed  # what was really sent, normalised
        return TickOutput(
            "twist",
            linear=linear,
            angular=angular,
            gripper=cmd.gripper,
            applied_action=applied.astype(np.float32),
            applied_gripper=cmd.gripper,
            applied_mode=cmd.mode,
        )
