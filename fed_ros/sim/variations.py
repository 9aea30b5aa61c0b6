"""Controlled environment variation: named presets and a seeded random generator.

A :class:`Variation` describes how one robot's scene differs from the default robosuite
scene (camera pose, lighting, table and object appearance, object size, a mirrored arm
mount). It is pure data
with validation; :mod:`fed_ros.sim.envs` applies it by editing the compiled MuJoCo model,
so no XML is regenerated and soft resets keep it. Variations are the source of the
non-IID heterogeneity between robots in a fleet.
"""

from __future__ import annotations

import math
from typing import Any, TypeGuard
from dataclasses import asdict, dataclass, fields, replace

import numpy as np

# Colour names usable for objects; instructions name them ("lift the blue cube"), so the
# language stays true to what the camera sees.
PALETTE: dict[str, tuple[float, float, float, float]] = {
    "red": (0.85, 0.10, 0.10, 1.0),
    "green": (0.10, 0.70, 0.15, 1.0),
    "blue": (0.10, 0.25, 0.90, 1.0),
    "yellow": (0.95, 0.85, 0.10, 1.0),
    "orange": (0.95, 0.50, 0.05, 1.0),
    "purple": (0.55, 0.15, 0.75, 1.0),
    "cyan": (0.10, 0.80, 0.85, 1.0),
    "white": (0.92, 0.92, 0.92, 1.0),
}

# Table surface materials that exist in every robosuite arena used here (table top and
# bins); swapping the material id changes the texture without uploading new textures.
TABLE_MATERIALS: dict[str, str] = {
    "metal": "table_legs_metal",
    "plaster": "walls_mat",
    "floor": "floorplane",
}

# What a textured object looks like, for the instruction ("stack the red cube on the brown cube").
MATERIAL_COLOR_WORDS: dict[str, str] = {"metal": "grey", "plaster": "white", "floor": "brown"}

# Limits keep the scene physically sensible and the scripted experts able to solve it:
# the Panda gripper opens to 8 cm and the soda can is 6.6 cm wide.
OBJECT_SCALE_RANGE = (0.75, 1.2)
CAMERA_SHIFT_LIMIT = 0.25  # metres per axis
CAMERA_ROTATION_LIMIT = 25.0  # degrees per axis
LIGHT_SCALE_RANGE = (0.0, 3.0)


def _is_number(v: object) -> TypeGuard[float]:
    return (
        isinstance(v, (int, float, np.integer, np.floating))
        and not isinstance(v, bool)
        and math.isfinite(v)
    )


def _check_vector(name: str, value: object, length: int, low: float, high: float) -> None:
    if not isinstance(value, (tuple, list, np.ndarray)) or len(value) != length:
        raise ValueError(f"Variation.{name} must be a sequence of {length} numbers, got {value!r}")
    for v in value:
        if not (_is_number(v) and low <= v <= high):
            raise ValueError(f"Variation.{name} value {v!r} outside [{low}, {high}]")


def _check_scalar(name: str, value: object, low: float, high: float) -> None:
    if not (_is_number(value) and low <= value <= high):
        raise ValueError(f"Variation.{name} must be a number in [{low}, {high}], got {value!r}")


@dataclass(frozen=True)
class Variation:
    """How one scene differs from the default; every field's default means 'unchanged'."""

    name: str = "custom"
    # Agent-view camera: position offset (m, world frame) and rotation offset
    # (pitch, yaw, roll in degrees, about the camera's own x, y, z axes).
    camera_pos_offset: tuple[float, float, float] = (0.0, 0.0, 0.0)
    camera_rot_offset: tuple[float, float, float] = (0.0, 0.0, 0.0)
    # Lighting: diffuse/specular multiplier of scene light and headlight, an RGB tint
    # multiplied into the diffuse colour, ambient level (None = unchanged), light position offset
    # (m).
    light_scale: float = 1.0
    light_tint: tuple[float, float, float] = (1.0, 1.0, 1.0)
    light_ambient: float | None = None
    light_pos_offset: tuple[float, float, float] = (0.0, 0.0, 0.0)
    # Table top: a material from TABLE_MATERIALS and/or a flat colour (flat colour wins).
    table_material: str | None = None
    table_rgba: tuple[float, float, float, float] | None = None
    # Task objects in task order (lift: cube; stack: cubeA, cubeB; pick_place_can: can),
    # colour names from PALETTE; fewer names than objects leaves the rest unchanged.
    object_colors: tuple[str, ...] = ()
    # Texture (a TABLE_MATERIALS name) for task objects that object_colors does not colour.
    object_material: str | None = None
    # Uniform scale of the task objects (geometry, mass and inertia scale consistently).
    object_scale: float = 1.0
    # Floor and wall colour (None = unchanged): background clutter for the image encoder.
    background_rgba: tuple[float, float, float, float] | None = None
    # Mirrored mount: the arm stands rotated 180 degrees about the vertical axis relative to
    # the shared work-cell frame its observations are expressed in (the benchmark's
    # mirrored-mount family), so its own x/y end-effector commands point the opposite way
    # in that frame. The simulator negates commanded x/y before stepping and the scripted
    # expert (make_expert) emits commands in the arm's frame; observations are unchanged.
    mount_mirrored: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ValueError(f"Variation.name must be a non-empty string, got {self.name!r}")
        _check_vector(
            "camera_pos_offset", self.camera_pos_offset, 3, -CAMERA_SHIFT_LIMIT, CAMERA_SHIFT_LIMIT
        )
        _check_vector(
            "camera_rot_offset",
            self.camera_rot_offset,
            3,
            -CAMERA_ROTATION_LIMIT,
            CAMERA_ROTATION_LIMIT,
        )
        _check_scalar("light_scale", self.light_scale, *LIGHT_SCALE_RANGE)
        _check_vector("light_tint", self.light_tint, 3, 0.0, 1.0)
        if self.light_ambient is not None:
            _check_scalar("light_ambient", self.light_ambient, 0.0, 1.0)
        _check_vector("light_pos_offset", self.light_pos_offset, 3, -2.0, 2.0)
        if self.table_material is not None and (
            not isinstance(self.table_material, str) or self.table_material not in TABLE_MATERIALS
        ):
            raise ValueError(
                f"Variation.table_material {self.table_material!r} not in {sorted(TABLE_MATERIALS)}"
            )
        if self.table_rgba is not None:
            _check_vector("table_rgba", self.table_rgba, 4, 0.0, 1.0)
        if self.background_rgba is not None:
            _check_vector("background_rgba", self.background_rgba, 4, 0.0, 1.0)
        if self.object_material is not None and (
            not isinstance(self.object_material, str) or self.object_material not in TABLE_MATERIALS
        ):
            raise ValueError(
                f"Variation.object_material {self.object_material!r} not in "
                f"{sorted(TABLE_MATERIALS)}"
            )
        if not isinstance(self.object_colors, (tuple, list)):
            raise ValueError(
                "Variation.object_colors must be a sequence of colour names, got "
                f"{self.object_colors!r}"
            )
        for colour in self.object_colors:
            if not isinstance(colour, str) or colour not in PALETTE:
                raise ValueError(
                    f"Variation.object_colors: unknown colour {colour!r}; known: {sorted(PALETTE)}"
                )
        _check_scalar("object_scale", self.object_scale, *OBJECT_SCALE_RANGE)
        if not isinstance(self.mount_mirrored, (bool, np.bool_)):
            raise ValueError(
                f"Variation.mount_mirrored must be a bool, got {self.mount_mirrored!r}"
            )
        object.__setattr__(self, "mount_mirrored", bool(self.mount_mirrored))
        # Plain tuples of floats, so variations compare by value and serialise to JSON.
        for name in (
            "camera_pos_offset",
            "camera_rot_offset",
            "light_tint",
            "light_pos_offset",
            "table_rgba",
            "background_rgba",
        ):
            if getattr(self, name) is not None:
                object.__setattr__(self, name, tuple(float(v) for v in getattr(self, name)))
        object.__setattr__(self, "object_colors", tuple(self.object_colors))
        for name in ("light_scale", "object_scale"):
            object.__setattr__(self, name, float(getattr(self, name)))
        if self.light_ambient is not None:
            object.__setattr__(self, "light_ambient", float(self.light_ambient))

    def to_dict(self) -> dict:
        """Plain JSON-able dict (for episode metadata and ROS parameters)."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> "Variation":
        """Inverse of :meth:`to_dict` (lists accepted for tuples); unknown keys raise ValueError."""
        if not isinstance(data, dict):
            raise ValueError(f"variation dict expected, got {data!r}")
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"unknown Variation fields {unknown}; known: {sorted(known)}")
        return cls(**data)


VARIATIONS: dict[str, Variation] = {
    v.name: v
    for v in (
        Variation(name="default"),
        Variation(name="dim_light", light_scale=0.35, light_ambient=0.05),
        Variation(name="bright_light", light_scale=1.8, light_ambient=0.35),
        Variation(
            name="warm_light", light_tint=(1.0, 0.75, 0.45), light_pos_offset=(0.8, -0.6, 0.0)
        ),
        Variation(name="red_table", table_rgba=(0.65, 0.12, 0.10, 1.0)),
        Variation(name="dark_table", table_rgba=(0.12, 0.12, 0.14, 1.0)),
        Variation(name="metal_table", table_material="metal"),
        Variation(
            name="shifted_camera",
            camera_pos_offset=(0.10, 0.15, 0.05),
            camera_rot_offset=(0.0, 8.0, 0.0),
        ),
        Variation(
            name="tilted_camera",
            camera_pos_offset=(-0.05, 0.0, 0.12),
            camera_rot_offset=(-10.0, 0.0, 6.0),
        ),
        Variation(name="big_objects", object_scale=1.15),
        Variation(name="small_objects", object_scale=0.8),
        Variation(name="blue_objects", object_colors=("blue", "yellow", "blue")),
        Variation(name="metal_objects", object_material="metal"),
        Variation(name="dark_background", background_rgba=(0.15, 0.15, 0.18, 1.0)),
        Variation(name="mirrored_mount", mount_mirrored=True),
    )
}


def random_variation(seed: int, name: str | None = None) -> Variation:
    """A random but seed-reproducible variation of every factor (moderate ranges)."""
    if not isinstance(seed, (int, np.integer)) or seed < 0:
        raise ValueError(f"random_variation seed must be a non-negative int, got {seed!r}")
    rng = np.random.default_rng([int(seed), 0x5EED])
    colours = list(PALETTE)

    def uniform(low: float, high: float, size: int | None = None):
        value = rng.uniform(low, high, size)
        return float(value) if size is None else tuple(float(v) for v in value)

    table_rgba = None
    table_material = None
    if rng.random() < 0.5:
        table_rgba = (*uniform(0.05, 0.9, 3), 1.0)
    else:
        table_material = str(rng.choice(sorted(TABLE_MATERIALS)))
    first, second = rng.choice(len(colours), size=2, replace=False)
    object_colors: tuple[Any, ...] = (colours[first], colours[second], colours[first])
    object_material = None
    if rng.random() < 0.35:
        # Only the manipulated object keeps a flat colour; the others show a texture.
        object_material = str(rng.choice(sorted(TABLE_MATERIALS)))
        object_colors = (colours[first],) if rng.random() < 0.5 else ()
    return Variation(
        name=name or f"random:{int(seed)}",
        camera_pos_offset=uniform(-0.08, 0.08, 3),
        camera_rot_offset=uniform(-8.0, 8.0, 3),
        light_scale=uniform(0.4, 1.6),
        light_tint=uniform(0.6, 1.0, 3),
        light_ambient=uniform(0.0, 0.4),
        light_pos_offset=uniform(-0.8, 0.8, 3),
        table_material=table_material,
        table_rgba=table_rgba,
        object_colors=object_colors,
        object_material=object_material,
        object_scale=uniform(0.85, 1.12),
        background_rgba=(*uniform(0.1, 0.9, 3), 1.0) if rng.random() < 0.5 else None,
    )


def resolve_variation(variation: "str | Variation | dict") -> Variation:
    """A preset name, ``"random:<seed>"``, a field dict or a Variation -> Variation (ValueError
    otherwise)."""
    if isinstance(variation, Variation):
        return variation
    if isinstance(variation, dict):
        return Variation.from_dict(variation)
    if not isinstance(variation, str):
        raise ValueError(f"variation must be a name or a Variation, got {variation!r}")
    if variation in VARIATIONS:
        return VARIATIONS[variation]
    if variation.startswith("random:"):
        suffix = variation[len("random:") :]
        if not suffix.isdigit():
            raise ValueError(f"variation {variation!r}: expected 'random:<non-negative int>'")
        return random_variation(int(suffix))
    raise ValueError(
        f"unknown variation {variation!r}; presets: {sorted(VARIATIONS)} or 'random:<seed>'"
    )


def with_name(variation: Variation, name: str) -> Variation:
    """Copy of ``variation`` under another name."""
    return replace(variation, name=name)
