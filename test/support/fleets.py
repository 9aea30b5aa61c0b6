"""Fleet files as tests write them: the smallest valid fleet (one simulated Lift robot, FedAvg,
one round) with the fields a test is about overridden, as the ``{"fleet": ...}`` document, as
a ``FleetConfig`` or as a YAML file."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

BASE: dict[str, Any] = {
    "name": "t",
    "algorithm": "fedavg",
    "rounds": 1,
    "robots": [{"task": "lift"}],
}


def fleet_data(**fields: Any) -> dict[str, Any]:
    """The ``fleet:`` mapping: :data:`BASE` with ``fields`` replacing its top-level keys."""
    return {**BASE, "robots": [dict(r) for r in BASE["robots"]], **fields}


def fleet_document(**fields: Any) -> dict[str, Any]:
    """``{"fleet": fleet_data(**fields)}``, what a fleet YAML file holds."""
    return {"fleet": fleet_data(**fields)}


def fleet_config(**fields: Any):
    """The validated ``FleetConfig`` of ``fleet_document(**fields)``."""
    from fed_ros.ros.fleet.fleet_file import fleet_config_from_dict

    return fleet_config_from_dict(fleet_document(**fields))


def write_fleet(path: Path, **fields: Any) -> Path:
    """``fleet_document(**fields)`` written as YAML at ``path``."""
    path.write_text(yaml.safe_dump(fleet_document(**fields)))
    return path
