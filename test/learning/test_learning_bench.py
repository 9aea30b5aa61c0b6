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


def test_modes_are_subcommands_and_the_old_flags_still_select_them(capsys):
    import pytest

    from fed_ros.bench.train import _with_subcommand, build_parser

    def parse(*argv):
        return build_parser().parse_args(_with_subcommand(list(argv)))

    steps = parse("--kinds", "image", "--threads", "2")
    assert (steps.mode, steps.kinds, steps.threads) == (None, "image", 2)
    # An option before the subcommand is kept: the subcommand's default does not overwrite it.
    lift = parse("--threads", "1", "lift", "--demos", "30")
    assert (lift.mode, lift.threads, lift.demos, lift.batch) == ("lift", 1, 30, 32)
    assert parse("lift", "--threads", "3").threads == 3
    old = parse("--lift", "--demos", "30", "--threads", "1")
    assert (old.mode, old.demos, old.threads) == ("lift", 30, 1)
    loop = parse("--closed-loop", "--task", "stack", "--kind", "lowdim")
    assert (loop.mode, loop.task, loop.kind) == ("closed-loop", "stack", "lowdim")
    assert parse("--data-path", "--quick").mode == "data-path"
    # A mode's own options belong to it: the step timer's --kinds is no lift option.
    with pytest.raises(SystemExit):
        parse("lift", "--kinds", "image")
    assert "unrecognized arguments: --kinds" in capsys.readouterr().err
