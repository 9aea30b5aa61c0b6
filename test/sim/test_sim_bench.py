"""`fed-ros bench sim` runs end to end on a tiny budget and reports positive rates."""

from __future__ import annotations

import json

import pytest

from fed_ros.bench import sim as bench_sim

pytestmark = pytest.mark.sim


def test_bench_sim_smoke(tmp_path, capsys) -> None:
    out = tmp_path / "sim.json"
    assert (
        bench_sim.main(
            [
                "--tasks",
                "lift",
                "--steps",
                "5",
                "--demos",
                "1",
                "--image-size",
                "32",
                "--no-bridge",
                "--json",
                str(out),
            ]
        )
        == 0
    )
    [row] = json.loads(out.read_text())
    assert (
        row["task"] == "lift"
        and row["raw_steps_s_cameras"] > 0
        and row["raw_steps_s_no_cameras"] > 0
    )
    assert row["demos_per_hour"] > 0 and row["bridge_steps_s_cameras"] is None
    assert "raw cams" in capsys.readouterr().out


def test_bench_sim_rejects_unknown_task() -> None:
    with pytest.raises(SystemExit):
        bench_sim.main(["--tasks", "juggle"])


def test_variation_sheet_cli_writes_distinct_tiles(tmp_path) -> None:
    import matplotlib.pyplot as plt
    import numpy as np

    from fed_ros.commands import render

    out = tmp_path / "sheet.png"
    assert (
        render.main(
            [
                "--task",
                "lift",
                "--variations",
                "default,red_table",
                "--image-size",
                "32",
                "--columns",
                "2",
                "--out",
                str(out),
            ]
        )
        == 0
    )
    sheet = plt.imread(out)
    assert sheet.shape[:2] == (64, 64)
    left, right = sheet[:, :32, :3], sheet[:, 32:, :3]
    assert np.abs(left - right).mean() > 0.02  # the red table is visible
