"""Arm profiles: what the arm adapter needs to know about one arm model (validated, ROS-free).

A profile (``config/arm_profiles/<name>.yaml``, top key ``arm_profile``) names the arm's
standard ROS 2 interfaces (ros2_control controllers, MoveIt Servo, joint_state_broadcaster,
cameras), its joints, limits, home pose and frames. A fleet file picks a profile per robot
and may override any field with a nested mapping (:func:`load_profile`). Pure Python and
PyYAML only: the fleet plan imports this where numpy/rclpy may be missing.
"""

from __future__ import annotations

import math
from dataclasses import MISSING, dataclass, field, fields, is_dataclass
from pathlib import Path
from typing import Any, Mapping, get_type_hints

import yaml

CAMERA_NAMES = ("agentview", "wrist")  # the policy's image observation keys
JOINT_COMMAND_INTERFACES = ("velocity", "position")


class ProfileError(ValueError):
    """A profile (or an override) is invalid; the message names the field and the value."""


def _finite(where: str, value: float, *, positive: bool = False, nonneg: bool = False) -> None:
    if not math.isfinite(value):
        raise ProfileError(f"{where} must be finite, got {value!r}")
    if positive and value <= 0:
        raise ProfileError(f"{where} must be > 0, got {value!r}")
    if nonneg and value < 0:
        raise ProfileError(f"{where} must be >= 0, got {value!r}")


def _topic(where: str, value: str, *, optional: bool = True) -> None:
    if not value and optional:
        return
    if not value or any(c.isspace() for c in value) or value.endswith("/") or "//" in value:
        raise ProfileError(f"{where} is not a valid topic name, got {value!r}")


@dataclass(frozen=True)
class JointsConfig:
    """The arm's joints in the order the policy and the controllers use."""

    names: tuple[str, ...]
    velocity_limits: tuple[float, ...]  # rad/s per joint (the controller's, or lower)
    home: tuple[float, ...]  # rad, the reset pose
    home_duration_s: float = 5.0  # time_from_start of the home trajectory point
    home_tolerance_rad: float = 0.05  # every joint this close to home = reset done

    def check(self, where: str) -> None:
        n = len(self.names)
        if n == 0:
            raise ProfileError(f"{where}.names must list the arm joints, got []")
        if len(set(self.names)) != n:
            raise ProfileError(f"{where}.names has duplicates: {list(self.names)}")
        for key in ("velocity_limits", "home"):
            values = getattr(self, key)
            if len(values) != n:
                raise ProfileError(
                    f"{where}.{key} has {len(values)} values for {n} joints "
                    f"{list(self.names)}, got {list(values)}"
                )
        for i, v in enumerate(self.velocity_limits):
            _finite(f"{where}.velocity_limits[{i}] ({self.names[i]})", v, positive=True)
        for i, v in enumerate(self.home):
            _finite(f"{where}.home[{i}] ({self.names[i]})", v)
        _finite(f"{where}.home_duration_s", self.home_duration_s, positive=True)
        _finite(f"{where}.home_tolerance_rad", self.home_tolerance_rad, positive=True)


@dataclass(frozen=True)
class GripperConfig:
    """Gripper: its joints in /joint_states and the command positions for open / closed."""

    joint_names: tuple[str, ...] = ()  # reported as the gripper state, in this order
    open: float = 0.0  # command position (m or rad) for action -1
    closed: float = 0.0  # command position for action +1

    def check(self, where: str) -> None:
        _finite(f"{where}.open", self.open)
        _finite(f"{where}.closed", self.closed)
        if self.joint_names and self.open == self.closed:
            raise ProfileError(f"{where}: open and closed must differ, both {self.open!r}")


@dataclass(frozen=True)
class LimitsConfig:
    """End-effector speed scaling and the workspace box (in ``frames.base``)."""

    max_linear_speed: float  # m/s commanded for a normalised delta of 1
    max_angular_speed: float  # rad/s commanded for a normalised delta of 1
    workspace_min: tuple[float, float, float]  # m, x y z of the end-effector, base frame
    workspace_max: tuple[float, float, float]

    def check(self, where: str) -> None:
        _finite(f"{where}.max_linear_speed", self.max_linear_speed, positive=True)
        _finite(f"{where}.max_angular_speed", self.max_angular_speed, positive=True)
        for key in ("workspace_min", "workspace_max"):
            values = getattr(self, key)
            if len(values) != 3:
                raise ProfileError(f"{where}.{key} must be [x, y, z], got {list(values)}")
            for v in values:
                _finite(f"{where}.{key}", v)
        for axis, lo, hi in zip("xyz", self.workspace_min, self.workspace_max):
            if lo >= hi:
                raise ProfileError(f"{where}: workspace {axis} min {lo!r} must be < max {hi!r}")


@dataclass(frozen=True)
class FramesConfig:
    """Frame ids: twists are expressed in ``base``; ``eef`` is the tool frame."""

    base: str
    eef: str

    def check(self, where: str) -> None:
        for key in ("base", "eef"):
            if not getattr(self, key):
                raise ProfileError(f"{where}.{key} must name a frame, got ''")


@dataclass(frozen=True)
class TopicsConfig:
    """Arm-side names. Absolute (``/joint_states``) or relative to the adapter's namespace."""

    joint_states: str  # sensor_msgs/JointState (joint_state_broadcaster)
    eef_pose: str  # geometry_msgs/PoseStamped of frames.eef in frames.base
    twist_command: str  # geometry_msgs/TwistStamped (MoveIt Servo)
    joint_command: str = ""  # std_msgs/Float64MultiArray (forward command controller)
    joint_command_interface: str = "velocity"  # what joint_command's controller claims
    gripper_command: str = ""  # std_msgs/Float64MultiArray [position]
    home_trajectory: str = ""  # trajectory_msgs/JointTrajectory (trajectory controller)
    object_state: str = ""  # std_msgs/Float32MultiArray from perception ("" = none)
    task_success: str = ""  # std_msgs/Bool: operator button / success detector

    def check(self, where: str) -> None:
        for f in fields(self):
            if f.name != "joint_command_interface":
                _topic(
                    f"{where}.{f.name}",
                    getattr(self, f.name),
                    optional=f.name not in ("joint_states", "eef_pose", "twist_command"),
                )
        if self.joint_command_interface not in JOINT_COMMAND_INTERFACES:
            raise ProfileError(
                f"{where}.joint_command_interface must be one of "
                f"{JOINT_COMMAND_INTERFACES}, got {self.joint_command_interface!r}"
            )


@dataclass(frozen=True)
class CameraConfig:
    """One camera stream: sensor_msgs/Image, or CompressedImage when ``compressed``."""

    topic: str
    compressed: bool = False


@dataclass(frozen=True)
class ArmProfile:
    """Everything the adapter needs about one arm model; validated on construction."""

    name: str
    joints: JointsConfig
    limits: LimitsConfig
    frames: FramesConfig
    topics: TopicsConfig
    gripper: GripperConfig = field(default_factory=GripperConfig)
    description: str = ""
    control_rate_hz: float = 20.0  # adapter ticks (observations, commands) per second
    watchdog_timeout_s: float = 0.25  # no policy command for this long -> zero twist
    cameras: Mapping[str, CameraConfig] = field(default_factory=dict)

    def __post_init__(self) -> None:
        where = f"arm profile {self.name!r}"
        if not self.name:
            raise ProfileError("arm profile: 'name' must not be empty")
        for key in ("joints", "limits", "frames", "topics", "gripper"):
            getattr(self, key).check(f"{where}: {key}")
        _finite(f"{where}: control_rate_hz", self.control_rate_hz, positive=True)
        _finite(f"{where}: watchdog_timeout_s", self.watchdog_timeout_s, positive=True)
        if self.watchdog_timeout_s < 1.0 / self.control_rate_hz:
            raise ProfileError(
                f"{where}: watchdog_timeout_s {self.watchdog_timeout_s!r} is shorter "
                f"than one control period (control_rate_hz {self.control_rate_hz!r})"
            )
        for cam, cfg in self.cameras.items():
            if cam not in CAMERA_NAMES:
                raise ProfileError(f"{where}: cameras.{cam} is not one of {CAMERA_NAMES}")
            _topic(f"{where}: cameras.{cam}.topic", cfg.topic, optional=False)
        overlap = set(self.joints.names) & set(self.gripper.joint_names)
        if overlap:
            raise ProfileError(
                f"{where}: joint(s) {sorted(overlap)} are both arm and gripper joints"
            )

    @property
    def period_s(self) -> float:
        """One control period, seconds."""
        return 1.0 / self.control_rate_hz


# --- building from YAML ------------------------------------------------------------------


def _coerce(where: str, hint: Any, value: Any) -> Any:
    """Value of a field with type ``hint`` from parsed YAML, or ProfileError."""
    if is_dataclass(hint):
        return _build(hint, value, where)
    origin = getattr(hint, "__origin__", None)
    if origin is tuple:
        if not isinstance(value, (list, tuple)):
            raise ProfileError(f"{where} must be a list, got {value!r}")
        item = hint.__args__[0]
        return tuple(_coerce(f"{where}[{i}]", item, v) for i, v in enumerate(value))
    if hint is bool:
        if not isinstance(value, bool):
            raise ProfileError(f"{where} must be true or false, got {value!r}")
        return value
    if hint is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ProfileError(f"{where} must be a number, got {value!r}")
        return float(value)
    if hint is str:
        if not isinstance(value, str):
            raise ProfileError(f"{where} must be a string, got {value!r}")
        return value
    raise TypeError(f"unsupported profile field type {hint!r} at {where}")  # programming error


def _build(cls: type, data: Any, where: str) -> Any:
    if not isinstance(data, Mapping):
        raise ProfileError(f"{where} must be a mapping, got {data!r}")
    hints = get_type_hints(cls)
    known = {f.name for f in fields(cls)}
    unknown = sorted(set(data) - known)
    if unknown:
        raise ProfileError(f"{where}: unknown field(s) {unknown} (known: {sorted(known)})")
    kwargs: dict[str, Any] = {}
    for f in fields(cls):
        if f.name not in data:
            continue
        sub = f"{where}.{f.name}"
        if f.name == "cameras" and cls is ArmProfile:
            cams = data[f.name] or {}
            if not isinstance(cams, Mapping):
                raise ProfileError(f"{sub} must be a mapping of camera name -> topic, got {cams!r}")
            kwargs[f.name] = {
                str(k): _build(CameraConfig, v, f"{sub}.{k}") for k, v in cams.items()
            }
        else:
            kwargs[f.name] = _coerce(sub, hints[f.name], data[f.name])
    missing = [
        f.name
        for f in fields(cls)
        if f.name not in data and f.default is MISSING and f.default_factory is MISSING
    ]
    if missing:
        raise ProfileError(f"{where}: missing required field(s) {missing}")
    return cls(**kwargs)


def merge_overrides(
    base: Mapping[str, Any], overrides: Mapping[str, Any], where: str = ""
) -> dict[str, Any]:
    """Deep merge: mappings merge key by key, anything else replaces."""
    out = dict(base)
    for key, value in overrides.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = merge_overrides(out[key], value, f"{where}{key}.")
        else:
            out[key] = value
    return out


def profile_from_dict(data: Any, overrides: Mapping[str, Any] | None = None) -> ArmProfile:
    """Validate a parsed profile (top key ``arm_profile`` optional) with optional overrides."""
    if isinstance(data, Mapping) and set(data) == {"arm_profile"}:
        data = data["arm_profile"]
    if not isinstance(data, Mapping):
        raise ProfileError(f"arm profile must be a mapping under 'arm_profile:', got {data!r}")
    if overrides:
        if not isinstance(overrides, Mapping):
            raise ProfileError(f"arm profile overrides must be a mapping, got {overrides!r}")
        data = merge_overrides(data, overrides)
    name = data.get("name", "")
    profile: ArmProfile = _build(ArmProfile, data, f"arm profile {name!r}")
    return profile


def config_dir(name: str) -> Path:
    """config/<name> (arm_profiles, teleop): from the installed share directory, else the source
    tree."""
    try:  # a colcon install: share/fed_ros/config/<name>
        from ament_index_python.packages import get_package_share_directory

        installed = Path(get_package_share_directory("fed_ros")) / "config" / name
        if installed.is_dir():
            return installed
    except Exception:  # noqa: BLE001 - ament_index missing or package not installed
        pass
    return Path(__file__).resolve().parents[3] / "config" / name


def profile_dir() -> Path:
    """config/arm_profiles (installed share directory, else the source tree)."""
    return config_dir("arm_profiles")


def available_profiles() -> list[str]:
    """Names of the profiles shipped in config/arm_profiles."""
    return sorted(p.stem for p in profile_dir().glob("*.yaml"))


def load_profile(name_or_path: str, overrides: Mapping[str, Any] | None = None) -> ArmProfile:
    """A shipped profile by name (``ur5e``) or a YAML file path, with optional overrides."""
    path = Path(name_or_path)
    if not (path.suffix in (".yaml", ".yml") and path.is_file()):
        path = profile_dir() / f"{name_or_path}.yaml"
        if not path.is_file():
            raise ProfileError(
                f"unknown arm profile {name_or_path!r}: not a YAML file and not one "
                f"of {available_profiles()}"
            )
    with open(path, encoding="utf-8") as f:
        return profile_from_dict(yaml.safe_load(f), overrides)


def parse_overrides(text: str) -> dict[str, Any]:
    """Overrides passed as a YAML/JSON string (the adapter's ``profile_overrides`` parameter)."""
    if not text.strip():
        return {}
    value = yaml.safe_load(text)
    if not isinstance(value, Mapping):
        raise ProfileError(f"profile_overrides must be a YAML mapping, got {text!r}")
    return dict(value)
