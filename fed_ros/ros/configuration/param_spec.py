"""Typed node parameters: each parameter declared once (type, default, unit, description, check).

A node's parameters are a frozen dataclass whose fields are made with :func:`param`. The
same declaration gives the node its ``ParameterDescriptor`` s (fed_ros.ros.nodes.typed_params),
the fleet plan its defaults and coercion, the set-parameters callback its checks, and the
test that config/*.yaml documents exactly these names and defaults. Pure Python: launch files
import it where rclpy may be missing.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, TypeVar

P = TypeVar("P", bound="NodeParams")

PARAM_TYPES = (bool, int, float, str, list)  # list = list of strings (ROS STRING_ARRAY)


@dataclass(frozen=True)
class ParamSpec:
    """One parameter: name, type, default, unit, description, bounds and whether it may change
    live."""

    name: str
    type: type
    default: Any
    description: str
    unit: str = ""
    live: bool = False  # False: read-only once the node runs (ROS rejects `param set`)
    ge: float | None = None  # inclusive lower bound
    gt: float | None = None  # exclusive lower bound
    le: float | None = None  # inclusive upper bound
    choices: tuple[str, ...] = ()
    check: Callable[[Any], str | None] | None = None  # extra rule: returns what is wrong, or None

    def coerce(self, node: str, value: Any) -> Any:
        """``value`` as this parameter's type, checked; ValueError names the parameter and value."""
        where = f"{node} parameter {self.name!r}"
        t = self.type
        if t is bool:
            if not isinstance(value, bool):
                raise ValueError(f"{where} must be a bool, got {value!r}")
        elif t is int:
            if isinstance(value, bool) or not isinstance(value, int):
                raise ValueError(f"{where} must be an integer, got {value!r}")
        elif t is float:
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise ValueError(f"{where} must be a number, got {value!r}")
            if not math.isfinite(value):
                raise ValueError(f"{where} must be finite, got {value!r}")
            value = float(value)
        elif t is str:
            if not isinstance(value, str):
                raise ValueError(f"{where} must be a string, got {value!r}")
        elif t is list:
            if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) for v in value):
                raise ValueError(f"{where} must be a list of strings, got {value!r}")
            value = list(value)
        if self.ge is not None and value < self.ge:
            raise ValueError(f"{where} must be >= {self.ge}{self.unit_text}, got {value!r}")
        if self.gt is not None and value <= self.gt:
            raise ValueError(f"{where} must be > {self.gt}{self.unit_text}, got {value!r}")
        if self.le is not None and value > self.le:
            raise ValueError(f"{where} must be <= {self.le}{self.unit_text}, got {value!r}")
        if self.choices and value not in self.choices:
            raise ValueError(f"{where} must be one of {self.choices}, got {value!r}")
        if self.check is not None:
            problem = self.check(value)
            if problem:
                raise ValueError(f"{where} {problem}, got {value!r}")
        return value

    @property
    def unit_text(self) -> str:
        return f" {self.unit}" if self.unit else ""

    def describe(self) -> str:
        """Description with unit, bounds and choices (the ParameterDescriptor's text)."""
        parts = [self.description]
        if self.unit:
            parts.append(f"unit: {self.unit}")
        if self.choices:
            parts.append(f"one of {', '.join(self.choices)}")
        parts.append("changes apply live" if self.live else "read-only while running")
        return "; ".join(parts)


def param(
    default: Any,
    description: str,
    *,
    unit: str = "",
    live: bool = False,
    ge: float | None = None,
    gt: float | None = None,
    le: float | None = None,
    choices: Sequence[str] = (),
    check: Callable[[Any], str | None] | None = None,
) -> Any:
    """A dataclass field declaring one node parameter (its type is the default's type)."""
    kind = type(default) if not isinstance(default, tuple) else list
    if kind not in PARAM_TYPES:
        raise TypeError(f"unsupported parameter default {default!r}")  # programming error
    meta = {
        "param": dict(
            default=default,
            description=description,
            unit=unit,
            live=live,
            ge=ge,
            gt=gt,
            le=le,
            choices=tuple(choices),
            check=check,
            type=kind,
        )
    }
    if isinstance(default, (list, tuple)):
        return field(default_factory=lambda: tuple(default), metadata=meta)
    return field(default=default, metadata=meta)


@dataclass(frozen=True)
class NodeParams:
    """Base of a node's typed parameters; subclasses add :func:`param` fields and ``_check``."""

    # Parameters under an open prefix (e.g. ``strategy.beta``), kept verbatim and validated by
    # whoever consumes the group (make_strategy, TrainerConfig).
    extra: Mapping[str, Any] = field(default_factory=dict)

    NODE: ClassVar[str] = "node"  # name used in error messages
    OPEN_PREFIXES: ClassVar[
        tuple[str, ...]
    ] = ()  # parameter groups passed through to their consumer
    # Old name -> new name of a renamed parameter: the old one is refused with the new name.
    RENAMED: ClassVar[Mapping[str, str]] = {}

    @classmethod
    def unknown_parameter(cls, name: str) -> str:
        """The error for an undeclared parameter ``name``: its new name when it was renamed,
        else every known one."""
        if name in cls.RENAMED:
            return f"{cls.NODE} parameter {name!r} was renamed {cls.RENAMED[name]!r}"
        return f"unknown {cls.NODE} parameter {name!r} (known: {', '.join(sorted(cls.specs()))})"

    @classmethod
    def specs(cls) -> dict[str, ParamSpec]:
        """Every declared parameter of this node, in declaration order."""
        out = {}
        for f in dataclasses.fields(cls):
            meta = f.metadata.get("param")
            if meta is not None:
                out[f.name] = ParamSpec(name=f.name, **meta)
        return out

    @classmethod
    def defaults(cls) -> dict[str, Any]:
        """Parameter name -> default, as ROS parameter values (lists for string arrays)."""
        return {
            n: (list(s.default) if s.type is list else s.default) for n, s in cls.specs().items()
        }

    @classmethod
    def is_open(cls, name: str) -> bool:
        """Whether ``name`` belongs to an open group (``<prefix>.<key>``)."""
        return any(name.startswith(p + ".") for p in cls.OPEN_PREFIXES)

    @classmethod
    def coerce(cls, params: Mapping[str, Any]) -> dict[str, Any]:
        """``params`` with every declared one converted to its type (ints to floats) and checked."""
        specs = cls.specs()
        out = {}
        for name, value in params.items():
            if name in specs:
                out[name] = specs[name].coerce(cls.NODE, value)
            elif cls.is_open(name):
                out[name] = value
            else:
                raise ValueError(cls.unknown_parameter(name))
        return out

    @classmethod
    def from_mapping(cls: type[P], params: Mapping[str, Any], **context: Any) -> P:
        """Defaults overlaid with ``params``, every value and cross-parameter rule checked."""
        values = cls.coerce(params)
        extra = {k: v for k, v in values.items() if cls.is_open(k)}
        fields = {
            k: (tuple(v) if isinstance(v, list) else v) for k, v in values.items() if k not in extra
        }
        return cls(extra=extra, **cls._resolve(fields, **context))

    @classmethod
    def _resolve(cls, fields: dict[str, Any], **context: Any) -> dict[str, Any]:
        """Fill context-dependent values (e.g. a robot id from the namespace); default: as given."""
        return fields

    def __post_init__(self) -> None:
        for name, spec in self.specs().items():
            value = getattr(self, name)
            spec.coerce(self.NODE, list(value) if spec.type is list else value)
        self._check()

    def _check(self) -> None:
        """Rules across parameters; raise ValueError naming them."""

    def replace(self: P, **changes: Any) -> P:
        """A checked copy with some parameters changed (what a live `ros2 param set` applies)."""
        specs = self.specs()
        coerced = {}
        for name, value in changes.items():
            if name not in specs:
                raise ValueError(self.unknown_parameter(name))
            value = specs[name].coerce(self.NODE, value)
            coerced[name] = tuple(value) if isinstance(value, list) else value
        return dataclasses.replace(self, **coerced)

    def as_dict(self) -> dict[str, Any]:
        """Parameter name -> value (lists for string arrays), open-group parameters included."""
        out = {
            n: (list(getattr(self, n)) if s.type is list else getattr(self, n))
            for n, s in self.specs().items()
        }
        out.update(self.extra)
        return out
