"""`fed-ros bench train --closed-loop` (issue 23 item 2), a tiny smoke version: scripted
PickPlaceCan demonstrations in MuJoCo, BC from the low-dim state, closed-loop evaluation; the
row names the task and policy kind and counts real rollouts."""

from __future__ import annotations

import json

import pytest


@pytest.mark.sim
def test_closed_loop_bc_on_pick_place_can_from_the_low_dim_state(tmp_path):
    from fed_ros.bench.train import main

    out = tmp_path / "can.json"
    argv = ["closed-loop", "--task", "pick_place_can", "--kind", "lowdim", "--demos", "2"]
    argv += ["--train-steps", "2", "--eval-episodes", "1", "--threads", "1", "--json", str(out)]
    argv += ["--policy", "{window: 2, embed_dim: 32}"]
    assert main(argv) == 0
    row = json.loads(out.read_text())
    assert (row["task"], row["kind"], row["steps"]) == ("pick_place_can", "lowdim", 2)
    assert row["successful_demos"] >= 1 and row["frames"] > 50  # real scripted demonstrations
    assert len(row["successes"]) == 1 and 0.0 <= row["success_rate"] <= 1.0
    # The recipe under test is the one trained, and the row says so.
    assert row["policy_overrides"] == {"window": 2, "embed_dim": 32}
    assert (row["policy"]["window"], row["policy"]["embed_dim"]) == (2, 32)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("{window: x}", "window must be a positive int, got 'x'"),
        ("{bogus: 1}", "unknown PolicyConfig field"),
        ("[1, 2]", "must be a YAML mapping"),
        ("{use_object_state: false}", "use_object_state=False needs kind='image'"),
    ],
)
def test_a_bad_policy_recipe_is_refused_before_any_demonstration_is_collected(
    text, message, capsys
):
    from fed_ros.bench.train import main

    argv = ["--closed-loop", "--task", "lift", "--kind", "lowdim", "--policy", text]
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2
    assert message in capsys.readouterr().err


@pytest.mark.sim
def test_closed_loop_image_policy_on_a_one_robot_encoder_it_trained_first(tmp_path):
    from safetensors.torch import load_file

    from fed_ros.bench.train import main

    out = tmp_path / "lift.json"
    argv = ["closed-loop", "--task", "lift", "--kind", "image", "--demos", "1"]
    argv += ["--train-steps", "2", "--eval-episodes", "1", "--threads", "1", "--json", str(out)]
    argv += ["--encoder-objective", "masked", "--encoder-rounds", "2", "--encoder-steps", "2"]
    argv += ["--policy", "{window: 2, embed_dim: 32}"]
    assert main(argv) == 0
    row = json.loads(out.read_text())
    enc = row["encoder"]
    assert enc["config"]["objective"] == "masked" and len(enc["rounds"]) == 2
    assert (
        enc["frames"] == row["frames"] > 20
        and enc["cpu_minutes"] > 0
        and row["cpu_minutes"]["encoder"] > 0
    )
    # The policy that was trained and rolled out read the trunk this run wrote.
    assert row["policy"]["vision_backbone"] == "fleet"
    assert (
        row["policy"]["backbone_weights"]
        == enc["file"]
        == str(out.with_suffix(".encoder.safetensors"))
    )
    assert "conv1.weight" in load_file(enc["file"])
    assert len(row["successes"]) == 1


def test_an_encoder_for_a_policy_without_cameras_is_refused(capsys):
    from fed_ros.bench.train import main

    argv = ["closed-loop", "--kind", "lowdim", "--encoder-objective", "proprio"]
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2
    assert (
        "--encoder-objective needs the image policy, got --kind lowdim" in capsys.readouterr().err
    )
