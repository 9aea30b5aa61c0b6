"""`fed-ros bench train --quick` runs end to end and reports both modes side by side."""

from __future__ import annotations

import json

import torch

from fed_ros.bench.train import main


def test_bench_train_quick_reports_bc_and_feddrman(tmp_path, capsys):
    old = torch.get_num_threads()
    try:
        rc = main(
            [
                "--quick",
                "--kinds",
                "lowdim",
                "--threads",
                "1",
                "--steps",
                "2",
                "--json",
                str(tmp_path / "rows.json"),
            ]
        )
    finally:
        torch.set_num_threads(old)
    assert rc == 0
    out = capsys.readouterr().out
    assert "BC steps/s" in out and "FedDRMan steps/s" in out and "lowdim" in out
    (row,) = json.loads((tmp_path / "rows.json").read_text())
    assert row["params"] > 0 and row["bc_steps_per_s"] > 0 and row["feddrman_steps_per_s"] > 0
    assert row["ratio"] > 0 and row["bc_peak_mem_mb"] > 0


def test_bench_train_quick_image_reports_profile_and_distinct_frames(tmp_path, capsys):
    old = torch.get_num_threads()
    try:
        rc = main(
            [
                "--quick",
                "--kinds",
                "image",
                "--threads",
                "1",
                "--steps",
                "1",
                "--image-profile",
                "resnet_t",
                "--json",
                str(tmp_path / "rows.json"),
            ]
        )
    finally:
        torch.set_num_threads(old)
    assert rc == 0
    assert "profile resnet_t" in capsys.readouterr().out
    (row,) = json.loads((tmp_path / "rows.json").read_text())
    assert row["image_profile"] == "resnet_t" and row["amp"] is False
    # batch 8 x window 5 over 4 short synthetic episodes: windows share frames.
    assert 0 < row["distinct_frames"] < row["batch"] * row["window"]
    assert row["bc_steps_per_s"] > 0 and row["feddrman_peak_mem_mb"] > 0
