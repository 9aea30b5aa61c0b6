"""Teleoperation mapping: a SpaceMouse or a gamepad (sensor_msgs/Joy, geometry_msgs/Twist) to arm
commands.

ROS-free (numpy + YAML) so every rule is unit-tested without DDS; the teleop node
(``fed_ros.ros.nodes.teleop.teleop_node``) converts messages and calls :class:`TeleopMapper`.

A :class:`TeleopProfile` (``config/teleop/<name>.yaml``) names which device axes drive the
normalised end-effector deltas x / y / z (each with ``scale`` and ``sign``), a ``deadzone``,
and which buttons are the ``deadman``, ``record_start``, ``record_stop``, ``label_success``,
``label_failure`` and ``gripper_toggle``. The mapper's output is the package's 4-D action
(``fed_ros.core.data.episode``: OSC position delta in [-1, 1] and the gripper in [-1 open,
1 closed]) or ``None``: hold. Rules:

* the arm moves only while the deadman button is held in the newest, valid, fresh Joy;
* a Joy with another axis or button count than the profile declares, or a non-finite axis,
  holds (with a reason) until a valid Joy arrives; its buttons are not taken;
* no Joy (or, with ``input: twist``, no Twist) for longer than ``watchdog_timeout_s`` holds,
  whatever the last message said (a deadman held on a device that died does not move the arm);
* button events are rising edges of valid Joys (a held button fires once).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Mapping

import numpy as np
from numpy.typing import NDArray
import numpy.typing as npt
import yaml

from fed_ros.core.arm.profile import config_dir

AXIS_NAMES = ("x", "y", "z")
BUTTON_NAMES = (
    "deadman",
    "record_start",
    "record_stop",
    "label_success",
    "label_failure",
    "gripper_toggle",
)
INPUTS = ("joy", "twist")  # where the motion axes come from; buttons always come from the Joy
TWIST_AXES = (
    6  # a Twist is read as the axes [linear.x, linear.y, linear.z, angular.x, angular.y, angular.z]
)
GRIPPER_OPEN, GRIPPER_CLOSED = -1.0, 1.0


@dataclass(frozen=True)
class AxisMap:
    """One end-effector delta from one device axis: ``sign * scale * axis`` after the deadzone."""

    axis: int
    scale: float = 1.0
    sign: int = 1


@dataclass(frozen=True)
class TeleopProfile:
    """A device layout: validated at construction (ValueError naming the bad entry)."""

    name: str
    axes_count: int  # axes a valid Joy carries
    buttons_count: int  # buttons a valid Joy carries
    axes: Mapping[str, AxisMap]  # x / y / z -> device axis
    buttons: Mapping[str, int]  # named button -> index (deadman required)
    deadzone: float = 0.1  # |axis| below this is zero; above, rescaled to start at 0
    watchdog_timeout_s: float = 0.5  # no device message for this long: hold
    input: str = "joy"  # "joy": axes from the Joy; "twist": axes from the Twist
    description: str = ""

    def __post_init__(self) -> None:
        where = f"teleop profile {self.name!r}"
        for key, value in (("axes_count", self.axes_count), ("buttons_count", self.buttons_count)):
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{where}: {key} must be an integer >= 1, got {value!r}")
        if self.input not in INPUTS:
            raise ValueError(f"{where}: input must be one of {list(INPUTS)}, got {self.input!r}")
        if not (isinstance(self.deadzone, (int, float)) and 0.0 <= self.deadzone < 1.0):
            raise ValueError(f"{where}: deadzone must be in [0, 1), got {self.deadzone!r}")
        if not (
            isinstance(self.watchdog_timeout_s, (int, float))
            and math.isfinite(self.watchdog_timeout_s)
            and self.watchdog_timeout_s > 0
        ):
            raise ValueError(
                f"{where}: watchdog_timeout_s must be > 0, got {self.watchdog_timeout_s!r}"
            )
        unknown = sorted(set(self.axes) - set(AXIS_NAMES))
        if unknown:
            raise ValueError(
                f"{where}: unknown axis {unknown[0]!r} (known: {', '.join(AXIS_NAMES)})"
            )
        if not self.axes:
            raise ValueError(f"{where}: maps no axis (map at least one of {', '.join(AXIS_NAMES)})")
        n_axes = TWIST_AXES if self.input == "twist" else self.axes_count
        for name, m in self.axes.items():
            if not isinstance(m.axis, int) or isinstance(m.axis, bool) or not 0 <= m.axis < n_axes:
                raise ValueError(
                    f"{where}: axis {name!r} index {m.axis!r} is outside the {n_axes} axes "
                    f"the {self.input} input has"
                )
            if not (isinstance(m.scale, (int, float)) and math.isfinite(m.scale) and m.scale > 0):
                raise ValueError(f"{where}: axis {name!r} scale must be > 0, got {m.scale!r}")
            if m.sign not in (1, -1):
                raise ValueError(f"{where}: axis {name!r} sign must be 1 or -1, got {m.sign!r}")
        unknown = sorted(set(self.buttons) - set(BUTTON_NAMES))
        if unknown:
            raise ValueError(
                f"{where}: unknown button {unknown[0]!r} (known: {', '.join(BUTTON_NAMES)})"
            )
        if "deadman" not in self.buttons:
            raise ValueError(f"{where}: no 'deadman' button (the arm moves only while it is held)")
        for name, index in self.buttons.items():
            if (
                not isinstance(index, int)
                or isinstance(index, bool)
                or not 0 <= index < self.buttons_count
            ):
                raise ValueError(
                    f"{where}: button {name!r} index {index!r} is outside the "
                    f"{self.buttons_count} buttons the profile declares"
                )


def profile_from_dict(data: Mapping[str, Any]) -> TeleopProfile:
    """A profile from its YAML mapping; ValueError names any unknown or bad key."""
    if not isinstance(data, Mapping):
        raise ValueError(f"a teleop profile must be a YAML mapping, got {type(data).__name__}")
    known = {
        "name",
        "axes_count",
        "buttons_count",
        "axes",
        "buttons",
        "deadzone",
        "watchdog_timeout_s",
        "input",
        "description",
    }
    name = str(data.get("name", ""))
    unknown = sorted(set(data) - known)
    if unknown:
        raise ValueError(
            f"teleop profile {name!r}: unknown key {unknown[0]!r} (known: "
            f"{', '.join(sorted(known))})"
        )
    axes: dict[str, AxisMap] = {}
    for axis_name, spec in dict(data.get("axes") or {}).items():
        if isinstance(spec, int):
            spec = {"axis": spec}
        if (
            not isinstance(spec, Mapping)
            or set(spec) - {"axis", "scale", "sign"}
            or "axis" not in spec
        ):
            raise ValueError(
                f"teleop profile {name!r}: axis {axis_name!r} must be an index or a mapping "
                f"with axis (and optional scale, sign), got {spec!r}"
            )
        axes[str(axis_name)] = AxisMap(spec["axis"], spec.get("scale", 1.0), spec.get("sign", 1))
    fields = {
        k: data[k] for k in ("deadzone", "watchdog_timeout_s", "input", "description") if k in data
    }
    return TeleopProfile(
        name=name,
        axes_count=data.get("axes_count"),
        buttons_count=data.get("buttons_count"),
        axes=axes,
        buttons=dict(data.get("buttons") or {}),
        **fields,
    )


def teleop_profile_dir() -> Path:
    """config/teleop (installed share directory, else the source tree)."""
    return config_dir("teleop")


def load_teleop_profile(name_or_path: str) -> TeleopProfile:
    """A shipped profile by name (``xbox``, ``spacemouse``) or a YAML file path."""
    path = Path(name_or_path)
    if not (path.suffix in (".yaml", ".yml") and path.is_file()):
        path = teleop_profile_dir() / f"{name_or_path}.yaml"
        if not path.is_file():
            shipped = sorted(p.stem for p in teleop_profile_dir().glob("*.yaml"))
            raise ValueError(
                f"unknown teleop profile {name_or_path!r}: not a YAML file and not one of {shipped}"
            )
    with open(path, encoding="utf-8") as f:
        return profile_from_dict(yaml.safe_load(f))


def apply_deadzone(value: float, deadzone: float) -> float:
    """0 inside the deadzone; outside it, rescaled so the output starts at 0 and reaches 1 at full
    travel."""
    magnitude = abs(value)
    if magnitude <= deadzone:
        return 0.0
    return math.copysign((magnitude - deadzone) / (1.0 - deadzone), value)


# What kind of hold a reason is: its text may change every tick (a stale device names the
# seconds since its last message), its kind changes only when the cause does.
HOLD_BAD_INPUT = "bad input"
HOLD_NO_JOY = "no Joy yet"
HOLD_STALE_JOY = "Joy stale"
HOLD_NO_TWIST = "no Twist yet"
HOLD_STALE_TWIST = "Twist stale"
HOLD_DEADMAN = "deadman released"


@dataclass
class TeleopOutput:
    """One control tick: the 4-D action to send, or None (hold) with the reason and its kind."""

    action: NDArray[Any] | None
    reason: str = ""
    kind: str = ""  # one of the HOLD_* kinds while holding, "" while moving


class HoldLog:
    """When to log a hold: at once when its kind changes, then every ``period_s`` while it lasts
    (a stale device's reason names a growing elapsed time: keyed on the text, it was logged on
    every tick, issue 36)."""

    def __init__(self, period_s: float) -> None:
        if not (math.isfinite(period_s) and period_s > 0):
            raise ValueError(f"the hold log period must be > 0 s, got {period_s!r}")
        self.period_s = float(period_s)
        self._kind, self._at = "", -math.inf

    def should_log(self, kind: str, now_s: float) -> bool:
        """Whether a hold of ``kind`` at ``now_s`` is logged (and, if so, remember it)."""
        if kind == self._kind and now_s - self._at < self.period_s:
            return False
        self._kind, self._at = kind, now_s
        return True


class TeleopMapper:
    """Turns device messages into commands; call :meth:`joy` / :meth:`twist` per message,
    :meth:`command` per tick."""

    def __init__(self, profile: TeleopProfile) -> None:
        self.profile = profile
        self.gripper = GRIPPER_OPEN
        self._buttons: tuple[int, ...] | None = None  # newest valid Joy's buttons
        self._joy_axes = np.zeros(profile.axes_count)
        self._twist_axes = np.zeros(TWIST_AXES)
        self._joy_at: float | None = None
        self._twist_at: float | None = None
        self._bad = ""  # why the newest device message was refused ("" when it was valid)

    # ------------------------------------------------------------------ device messages in
    def joy(self, axes: npt.ArrayLike, buttons: Iterable[int], now_s: float) -> list[str]:
        """Take one Joy (receive time ``now_s``); returns the named buttons that went down (rising
        edges)."""
        p = self.profile
        try:
            values = np.asarray(axes, dtype=np.float64).reshape(-1)
            pressed = tuple(int(b) for b in buttons)
        except (TypeError, ValueError) as exc:
            return self._refuse(f"unreadable Joy ({exc})")
        if values.size != p.axes_count or len(pressed) != p.buttons_count:
            return self._refuse(
                f"Joy has {values.size} axes / {len(pressed)} buttons, profile {p.name!r} "
                f"expects {p.axes_count} / {p.buttons_count}"
            )
        if not np.all(np.isfinite(values)):
            return self._refuse(f"Joy has non-finite axes {values.tolist()}")
        before = self._buttons
        self._buttons, self._joy_axes, self._joy_at, self._bad = pressed, values, now_s, ""
        events = [
            name
            for name, i in p.buttons.items()
            if pressed[i] and (before is None or not before[i])
        ]
        if "gripper_toggle" in events:
            self.gripper = GRIPPER_CLOSED if self.gripper == GRIPPER_OPEN else GRIPPER_OPEN
        return events

    def twist(self, linear: npt.ArrayLike, angular: npt.ArrayLike, now_s: float) -> None:
        """Take one Twist (``linear`` and ``angular`` as 3 values each); a non-finite one holds."""
        values = np.concatenate(
            [
                np.asarray(linear, dtype=np.float64).reshape(-1),
                np.asarray(angular, dtype=np.float64).reshape(-1),
            ]
        )
        if values.size != TWIST_AXES or not np.all(np.isfinite(values)):
            self._bad = f"Twist has non-finite or missing values {values.tolist()}"
            return
        self._twist_axes, self._twist_at = values, now_s
        if self._bad.startswith("Twist"):
            self._bad = ""

    def _refuse(self, reason: str) -> list[str]:
        # Nothing of a bad Joy is taken: no buttons (no edges, no deadman), no axes.
        self._bad = reason
        self._buttons = None
        return []

    # ------------------------------------------------------------------ per tick
    def command(self, now_s: float) -> TeleopOutput:
        """The action for this tick, or hold (None) with why."""
        p = self.profile
        kind, reason = self._hold_reason(now_s)
        if kind:
            return TeleopOutput(None, reason, kind)
        axes = self._twist_axes if p.input == "twist" else self._joy_axes
        delta = np.zeros(3)
        for i, name in enumerate(AXIS_NAMES):
            m = p.axes.get(name)
            if m is not None:
                delta[i] = m.sign * m.scale * apply_deadzone(float(axes[m.axis]), p.deadzone)
        action = np.append(np.clip(delta, -1.0, 1.0), self.gripper).astype(np.float32)
        return TeleopOutput(action)

    def _hold_reason(self, now_s: float) -> tuple[str, str]:
        """(kind, reason) of the hold this tick; ("", "") when the arm may move."""
        p = self.profile
        if self._bad:
            return HOLD_BAD_INPUT, f"bad input: {self._bad}"
        if self._joy_at is None or self._buttons is None:
            return HOLD_NO_JOY, "no Joy from the device yet"
        if now_s - self._joy_at > p.watchdog_timeout_s:
            return HOLD_STALE_JOY, (
                f"device stale: no Joy for {now_s - self._joy_at:.2f} s "
                f"(> {p.watchdog_timeout_s:g} s)"
            )
        if p.input == "twist":
            if self._twist_at is None:
                return HOLD_NO_TWIST, "no Twist from the device yet"
            if now_s - self._twist_at > p.watchdog_timeout_s:
                return HOLD_STALE_TWIST, (
                    f"device stale: no Twist for {now_s - self._twist_at:.2f} s "
                    f"(> {p.watchdog_timeout_s:g} s)"
                )
        if not self._buttons[p.buttons["deadman"]]:
            return HOLD_DEADMAN, "deadman released"
        return "", ""
