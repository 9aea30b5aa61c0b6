"""The Foxglove layout made from a fleet file (`fed-ros status FLEET --foxglove-layout OUT`): its
panels are exactly the tree's leaves, it reads only the fleet's topics and message fields that
exist, image fleets get every robot's cameras, and the shipped config/foxglove_layout.json is
the demo fleet's layout as the generator makes it today (one source of truth). That the topics
are on the live graph of a running fleet is checked in test_web_status_browser.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fed_ros.ros.fleet.fleet_file import fleet_config_from_dict, load_fleet_config
from fed_ros.ros.operator.foxglove_layout import (
    foxglove_layout,
    layout_leaves,
    layout_topics,
)

pytest.importorskip("rclpy")
REPO = Path(__file__).resolve().parents[2]


def _fleet(policy: str, real_arm: bool = False):
    robots = [{"id": f"robot_{i}", "task": "lift"} for i in range(3)]
    if real_arm:
        robots[2] = {"id": "robot_2", "task": "lift", "sim": False, "profile": "ur5e"}
    return fleet_config_from_dict(
        {
            "fleet": {
                "name": "f",
                "algorithm": "feddrman",
                "rounds": 2,
                "policy": policy,
                "robots": robots,
            }
        }
    )


def test_the_shipped_layout_is_the_demo_fleets_as_generated(tmp_path):
    from fed_ros.ros.fleet.cli import status_main

    out = tmp_path / "layout.json"
    assert (
        status_main([str(REPO / "config" / "fleet_demo.yaml"), "--foxglove-layout", str(out)]) == 0
    )
    shipped = json.loads((REPO / "config" / "foxglove_layout.json").read_text())
    assert (
        json.loads(out.read_text())
        == shipped
        == foxglove_layout(load_fleet_config(REPO / "config" / "fleet_demo.yaml"))
    )
    assert status_main(["--foxglove-layout", str(out)]) == 2  # needs the fleet file


@pytest.mark.parametrize(
    "policy,real_arm,cameras", [("lowdim", False, 0), ("image", False, 6), ("lowdim", True, 2)]
)
def test_panels_are_the_trees_leaves_and_cameras_follow_the_fleet(policy, real_arm, cameras):
    layout = foxglove_layout(_fleet(policy, real_arm))
    leaves = layout_leaves(layout["layout"])
    assert sorted(leaves) == sorted(layout["configById"]) and len(set(leaves)) == len(leaves)
    images = [p for p in leaves if p.startswith("Image!")]
    assert len(images) == cameras
    topics = layout_topics(layout)
    assert {"/fleet/round", "/fleet/round_report", "/diagnostics"} <= topics
    if policy == "image":
        assert "/robot_1/arm/wrist/image_raw" in topics
    if real_arm:
        assert {t for t in topics if "image_raw" in t} == {
            "/robot_2/arm/agentview/image_raw",
            "/robot_2/arm/wrist/image_raw",
        }
    success = layout["configById"]["Plot!success"]["paths"]
    assert [p["label"] for p in success] == ["robot_0", "robot_1", "robot_2"]


def test_the_plotted_fields_exist_in_the_messages():
    from fed_ros.msg import RobotMetrics, RoundReport

    layout = foxglove_layout(_fleet("lowdim"))
    report = RoundReport.get_fields_and_field_types()
    robot = RobotMetrics.get_fields_and_field_types()
    for panel in ("Plot!success", "Plot!updates"):
        for path in layout["configById"][panel]["paths"]:
            fields = path["value"].split(".", 1)[1]
            if fields.startswith("robots[:]"):
                assert "robots" in report and fields.rsplit(".", 1)[1] in robot, fields
                assert "{robot_id==" in fields and "robot_id" in robot
            else:
                assert fields in report, fields
