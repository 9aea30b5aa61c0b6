"""A Foxglove layout for a fleet, made from its fleet file (`fed-ros status FLEET --foxglove-layout
OUT.json`; config/foxglove_layout.json is the demo fleet's).

Foxglove reaches a ROS 2 graph through `foxglove_bridge` (a ROS install's package, on the fleet's
domain). The layout opens on what the fleet publishes: each robot's cameras (when its policy or
arm has them), every robot's success rate per round and the updates accepted and rejected (Plot
panels over `/fleet/round_report`), the newest announcement and round report (Raw Messages:
round state, memberships, per-robot reasons), and `/diagnostics` (every node's status). One
source of truth: the topics are the fleet plan's (`fed_ros.ros.arm.topics`, the server's
`/fleet/...` names), so a layout made from a fleet file names exactly that fleet's topics.

The file is Foxglove's layout JSON: ``configById`` (panel id ``Type!name`` -> settings) and
``layout``, a binary tree of row/column splits whose leaves are panel ids.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from fed_ros.ros.arm.topics import AGENTVIEW_TOPIC, WRIST_TOPIC

FLEET_NS = "/fleet"
ANNOUNCEMENT_TOPIC = f"{FLEET_NS}/round"
REPORT_TOPIC = f"{FLEET_NS}/round_report"
DIAGNOSTICS_TOPIC = "/diagnostics"


def camera_topics(config: Any) -> dict[str, list[str]]:
    """Each robot's camera topics: both cameras of an image-policy fleet's sim bridges and of
    every real arm with a profile (its adapter relays them on the same names); none for a
    low-dim simulated robot (its bridge renders no frames)."""
    out: dict[str, list[str]] = {}
    for robot in config.robots:
        if config.policy == "image" or (not robot.sim and robot.profile):
            out[robot.robot_id] = [f"/{robot.robot_id}/{t}" for t in (AGENTVIEW_TOPIC, WRIST_TOPIC)]
    return out


def _split(leaves: Sequence[Any], direction: str) -> Any:
    """A balanced binary tree of ``direction`` splits over the leaves (equal shares)."""
    if len(leaves) == 1:
        return leaves[0]
    half = len(leaves) // 2
    return {
        "direction": direction,
        "first": _split(leaves[:half], direction),
        "second": _split(leaves[half:], direction),
        "splitPercentage": round(100.0 * half / len(leaves), 2),
    }


def foxglove_layout(config: Any) -> dict[str, Any]:
    """The layout (a JSON-ready dict) for the fleet of ``config`` (a FleetConfig)."""
    robots = [r.robot_id for r in config.robots]
    panels: dict[str, dict[str, Any]] = {
        "Plot!success": {
            "title": "success rate per robot (evaluated rounds)",
            "paths": [
                {
                    "value": f'{REPORT_TOPIC}.robots[:]{{robot_id=="{rid}"}}.success_rate',
                    "enabled": True,
                    "timestampMethod": "receiveTime",
                    "label": rid,
                }
                for rid in robots
            ],
            "showLegend": True,
            "xAxisVal": "timestamp",
        },
        "Plot!updates": {
            "title": "updates per round",
            "paths": [
                {
                    "value": f"{REPORT_TOPIC}.{field}",
                    "enabled": True,
                    "timestampMethod": "receiveTime",
                    "label": field,
                }
                for field in ("updates_accepted", "updates_rejected")
            ],
            "showLegend": True,
            "xAxisVal": "timestamp",
        },
        "RawMessages!announcement": {"topicPath": ANNOUNCEMENT_TOPIC, "expansion": "all"},
        "RawMessages!report": {"topicPath": REPORT_TOPIC, "expansion": "all"},
        "DiagnosticSummary!fleet": {"topicToRender": DIAGNOSTICS_TOPIC},
    }
    cameras = []
    for rid, topics in camera_topics(config).items():
        for topic in topics:
            pid = f"Image!{rid}_{topic.rsplit('/', 2)[-2]}"
            # imageMode.imageTopic is the current panel's setting, cameraTopic the older one's.
            panels[pid] = {"imageMode": {"imageTopic": topic}, "cameraTopic": topic}
            cameras.append(pid)
    state = _split(
        ["Plot!success", "Plot!updates", "RawMessages!report", "RawMessages!announcement"], "row"
    )
    bottom = _split([state, "DiagnosticSummary!fleet"], "column")
    tree = bottom if not cameras else _split([_split(cameras, "row"), bottom], "column")
    return {
        "configById": panels,
        "globalVariables": {},
        "userNodes": {},
        "playbackConfig": {"speed": 1},
        "layout": tree,
    }


def layout_topics(layout: dict[str, Any]) -> set[str]:
    """Every topic a layout's panels read (tests check them against the fleet's)."""
    topics: set[str] = set()
    for config in layout["configById"].values():
        for key in ("topicPath", "topicToRender", "cameraTopic"):
            if key in config:
                topics.add(config[key].split(".", 1)[0])
        for path in config.get("paths", []):
            topics.add(path["value"].split(".", 1)[0])
    return topics


def layout_leaves(tree: Any) -> list[str]:
    """The panel ids of a layout tree, left to right."""
    if isinstance(tree, str):
        return [tree]
    return layout_leaves(tree["first"]) + layout_leaves(tree["second"])
