"""The `fed-ros demo` result table: per-round success, family means, cluster verdict (no ROS)."""

from __future__ import annotations

import math
from pathlib import Path

from fed_ros.ros.fleet.demo import format_round_table, format_summary

REPO = Path(__file__).resolve().parents[2]

TASKS = {
    "robot_0": ("lift",),
    "robot_1": ("lift",),
    "robot_2": ("pick_place_can",),
    "robot_3": ("pick_place_can",),
}


def _report(
    round_idx: int, success: list[float], clusters: list[int], completed: bool = True
) -> dict:
    return {
        "round": round_idx,
        "status": "aggregated",
        "completed": completed,
        "updates_accepted": 4,
        "updates_received": 4,
        "aggregation_seconds": 0.1,
        "clusters": [],
        "robots": [
            {"robot_id": f"robot_{i}", "success_rate": s, "cluster_ids": [c], "train_loss": 1.5}
            for i, (s, c) in enumerate(zip(success, clusters))
        ],
    }


def test_summary_compares_first_and_last_evaluated_round():
    reports = [
        _report(0, [0.0, 0.25, 0.0, 0.0], [0, 0, 1, 1]),
        _report(1, [math.nan] * 4, [0, 0, 1, 1]),  # no evaluation this round
        _report(2, [0.5] * 4, [0, 0, 1, 1], completed=False),  # abandoned: ignored
        _report(3, [0.75, 1.0, 0.0, 0.25], [0, 0, 1, 1]),
    ]
    text = format_summary(reports, TASKS)
    assert (
        "mean success: round 0 0.06 -> round 3 0.50 (lift 0.12 -> 0.88, pick_place_can 0.00 -> "
        "0.12)" in text
    )
    assert (
        "cluster 0: robot_0, robot_1; cluster 1: robot_2, robot_3 (each task family is one cluster)"
        in text
    )
    rows = [line for line in text.splitlines() if line.lstrip().startswith(("0 |", "3 |"))]
    assert len(rows) == 2 and "1.00 [0]" in rows[1]


def test_summary_flags_mixed_clusters_and_missing_evaluations():
    mixed = format_summary([_report(0, [0.0] * 4, [0, 1, 0, 1])], TASKS)
    assert "clusters MIX task families" in mixed
    assert (
        format_summary([_report(0, [math.nan] * 4, [0, 0, 1, 1])], TASKS)
        == "summary: no evaluated round completed"
    )


def test_round_table_shows_dashes_for_missing_values():
    table = format_round_table(_report(1, [math.nan, 0.5, math.nan, 0.0], [0, 0, 1, 1]), TASKS)
    assert "robot_0" in table and "lift" in table and "0.50" in table and " -" in table


def test_plots_are_written_under_the_run_dir(tmp_path):
    from fed_ros.ros.fleet.demo import write_plots
    from fed_ros.ros.fleet.fleet_file import fleet_config_from_dict

    config = fleet_config_from_dict(
        {
            "fleet": {
                "name": "t",
                "algorithm": "feddrman",
                "rounds": 2,
                "robots": [{"id": rid, "task": t[0]} for rid, t in TASKS.items()],
            }
        }
    )
    reports = [
        _report(0, [0.0, 0.25, 0.0, 0.0], [0, 0, 1, 1]),
        _report(1, [1.0, 1.0, 0.0, 0.5], [0, 0, 1, 1]),
    ]
    paths = write_plots(reports, config, tmp_path)
    assert sorted(p.name for p in paths) == [
        "clusters.png",
        "success_per_round.png",
        "train_loss_per_round.png",
    ]
    assert all(p.parent == tmp_path and p.stat().st_size > 1000 for p in paths)
    assert (
        write_plots([_report(0, [0.0] * 4, [0] * 4, completed=False)], config, tmp_path / "none")
        == []
    )


def test_final_success_by_task_is_the_last_evaluated_round_per_family():
    from fed_ros.ros.fleet.demo import final_success_by_task

    reports = [
        _report(0, [0.0, 0.25, 0.0, 0.0], [0, 0, 1, 1]),
        _report(1, [1.0, 0.5, 0.25, 1.0], [0, 0, 1, 1]),
        _report(2, [math.nan] * 4, [0, 0, 1, 1]),
    ]  # not evaluated: the last evaluated is round 1
    assert final_success_by_task(reports, TASKS) == {"lift": 0.75, "pick_place_can": 0.625}
    assert final_success_by_task([], TASKS) == {}


def test_a_non_default_variation_is_its_own_family():
    from fed_ros.ros.fleet.demo import family_labels
    from fed_ros.ros.fleet.fleet_file import fleet_config_from_dict

    config = fleet_config_from_dict(
        {
            "fleet": {
                "name": "t",
                "algorithm": "feddrman",
                "rounds": 1,
                "robots": [
                    {"id": "robot_0", "task": "lift"},
                    {"id": "robot_1", "task": "lift", "variation": "mirrored_mount"},
                ],
            }
        }
    )
    assert family_labels(config) == {"robot_0": ("lift",), "robot_1": ("lift/mirrored_mount",)}


def test_demo_policy_image_without_a_fleet_file_runs_the_image_demo_fleet(tmp_path):
    from fed_ros.ros.fleet.demo import demo_config
    from fed_ros.ros.fleet.plan import plan_fleet

    lowdim = demo_config(None, None, None, None)
    assert (lowdim.name, lowdim.policy) == ("demo", "lowdim")
    image = demo_config(None, "image", None, str(tmp_path))
    # The image demo: same 4 arms in 2 families, 150 demonstrations per family, cameras only.
    assert (image.name, image.policy, image.run_dir) == ("demo_image", "image", str(tmp_path))
    assert [(r.tasks, r.variation) for r in image.robots] == [
        (r.tasks, r.variation) for r in lowdim.robots
    ]
    assert sum(r.parameters["collect_demos_on_start"] for r in image.robots) == 2 * 150
    assert image.robot_defaults["trainer.lr_schedule"] == "cosine"
    # Every node's parameters validate (a bad key or value would stop the fleet at start).
    robots = [n for n in plan_fleet(image) if n.executable == "robot_node"]
    assert [n.parameters["trainer.lr_schedule"] for n in robots] == ["cosine"] * 4
    # An explicit fleet file wins; --policy and --rounds override it.
    demo_file = str(REPO / "config" / "fleet_demo.yaml")
    switched = demo_config(demo_file, "image", 2, None)
    assert (switched.name, switched.policy, switched.rounds) == ("demo", "image", 2)
