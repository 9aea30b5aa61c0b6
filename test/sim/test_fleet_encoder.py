"""The fleet's shared visual encoder: FedAvg by frame count, frozen and cached in the policy,
its objective learns, and the benchmark's encoder stage serves the policy rounds."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fed_ros.core.data import episode as ep
from fed_ros.core.rounds.config import RoundConfig
from fed_ros.learning.client import RobotClient
from fed_ros.learning.configuration_fleet_encoder import FleetEncoderConfig
from fed_ros.learning.configuration_policy import PolicyConfig
from fed_ros.learning.dataset import DemoDataset, synthetic_episodes
from fed_ros.learning.fleet_encoder import (
    aggregate_encoders,
    evaluate_encoder,
    initial_encoder_state,
    save_backbone,
)
from fed_ros.learning.modeling_policy import build_policy
from fed_ros.learning.weights import policy_to_state_dict

pytestmark = pytest.mark.usefixtures("torch_one_thread")

SIZE = 32  # small frames: the conv net's map is 4x4, a step takes milliseconds
TINY_POLICY = dict(
    kind="image",
    image_size=SIZE,
    embed_dim=32,
    window=2,
    transformer_layers=1,
    transformer_heads=2,
    transformer_ff=64,
    dropout=0.0,
    text_dim=64,
    conv_channels=(8, 16),
    num_keypoints=8,
)


def encoder_cfg(**kw) -> FleetEncoderConfig:
    base = dict(image_size=SIZE, rounds=1, local_steps=3, batch_size=8, num_keypoints=8)
    return FleetEncoderConfig(**{**base, **kw})


def robot_data(n_robots: int = 3) -> dict[str, list[ep.Episode]]:
    # Different numbers of episodes, so frame-weighting differs from a plain mean.
    return {
        f"robot_{i}": synthetic_episodes(1 + i, 6 + 2 * i, "image", seed=i, image_size=SIZE)
        for i in range(n_robots)
    }


def clients(policy: PolicyConfig, ids) -> dict[str, RobotClient]:
    return {rid: RobotClient(rid, policy, robot_seed=i, device="cpu") for i, rid in enumerate(ids)}


def fleet_policy(path) -> PolicyConfig:
    return PolicyConfig(**TINY_POLICY, vision_backbone="fleet", backbone_weights=str(path))


def test_encoder_fedavg_is_the_frame_weighted_mean_of_the_robots_encoders(tmp_path):
    cfg = encoder_cfg()
    data = robot_data()
    path = save_backbone(initial_encoder_state(cfg), tmp_path / "fleet_encoder.safetensors")
    robots = clients(fleet_policy(path), data)
    start = initial_encoder_state(cfg)
    results = [robots[r].fit_encoder(start, cfg, data[r], 0) for r in data]
    frames = [sum(len(e) for e in data[r]) for r in data]
    assert [res.num_samples for res in results] == frames == [6, 16, 30]
    avg = aggregate_encoders(results)
    for key in start:
        expected = sum(f * res.params[key] for f, res in zip(frames, results)) / sum(frames)
        np.testing.assert_allclose(avg[key], expected, rtol=1e-5, atol=1e-6, err_msg=key)
    # Each robot moved the shared trunk, and the average is none of them.
    key = "backbone.conv1.weight"
    assert all(not np.array_equal(res.params[key], start[key]) for res in results)
    assert not np.allclose(avg[key], np.mean([res.params[key] for res in results], axis=0))


@pytest.mark.parametrize("objective", ["proprio", "temporal", "masked"])
def test_encoder_loss_falls_on_its_objective(objective):
    cfg = encoder_cfg(objective=objective, local_steps=40, batch_size=16, lr=3e-3)
    eps = synthetic_episodes(3, 12, "image", seed=5, image_size=SIZE)
    client = RobotClient("r0", PolicyConfig(**TINY_POLICY), device="cpu")
    start = initial_encoder_state(cfg)
    result = client.fit_encoder(start, cfg, eps, 0)
    before = evaluate_encoder(start, eps, cfg)
    after = evaluate_encoder(result.params, eps, cfg)
    assert after < 0.7 * before, (before, after)
    assert result.metrics["loss_last"] < result.metrics["loss_first"]


def test_policy_reads_the_fleet_encoder_frozen_and_cached(tmp_path):
    cfg = encoder_cfg()
    eps = synthetic_episodes(2, 6, "image", seed=1, image_size=SIZE)
    trained = RobotClient("r0", PolicyConfig(**TINY_POLICY), device="cpu").fit_encoder(
        initial_encoder_state(cfg), cfg, eps, 0
    )
    path = save_backbone(trained.params, tmp_path / "fleet_encoder.safetensors")
    policy_cfg = fleet_policy(path)
    model = build_policy(policy_cfg, seed=0)
    # Nothing of the encoder is in the policy's update: it ships once, fleet-wide.
    assert not any("backbone" in k or "trunk" in k for k in policy_to_state_dict(model))
    frozen = model.agentview_encoder.frozen
    assert frozen is model.wrist_encoder.frozen
    # The trunk holds the federated weights, not a fresh init.
    weight = frozen.trunk.backbone.conv1.weight.detach().numpy()
    np.testing.assert_array_equal(weight, trained.params["backbone.conv1.weight"])
    frozen.clear()
    batch = DemoDataset(eps, policy_cfg).torch_batch(np.arange(4))
    loss, _ = model(batch)
    loss.backward()
    assert all(p.grad is None for p in frozen.trunk.parameters())
    assert frozen.misses > 0
    misses, hits = frozen.misses, frozen.hits
    model.features(batch)
    assert frozen.misses == misses and frozen.hits > hits  # every frame from the cache


def test_policy_without_an_encoder_file_names_the_stage(tmp_path):
    missing = tmp_path / "nowhere.safetensors"
    with pytest.raises(FileNotFoundError, match="fleet encoder stage"):
        build_policy(fleet_policy(missing))
    with pytest.raises(FileNotFoundError, match="no published weights file"):
        build_policy(PolicyConfig(**TINY_POLICY, vision_backbone="fleet"))


@pytest.mark.parametrize(
    "kw,match",
    [
        ({"objective": "contrastive"}, "objective must be one of"),
        ({"mask_ratio": 1.0}, "mask_ratio must be a number in \\(0, 1\\), got 1.0"),
        ({"mask_ratio": 0}, "mask_ratio must be a number in \\(0, 1\\), got 0"),
        ({"mask_patch": 0}, "mask_patch must be an int >= 1, got 0"),
        ({"cameras": ("depth",)}, "cameras must be"),
        ({"local_steps": 0}, "local_steps must be an int >= 1, got 0"),
        ({"refresh_every": -1}, "refresh_every must be an int >= 0, got -1"),
        ({"lr": 0.0}, "lr must be a number > 0, got 0.0"),
    ],
)
def test_config_rejects_bad_settings_naming_them(kw, match):
    with pytest.raises(ValueError, match=match):
        FleetEncoderConfig(**kw)


def test_encoder_state_of_another_objective_is_refused():
    from fed_ros.learning.fleet_encoder import build_encoder

    with pytest.raises(ValueError, match="does not fit objective 'temporal'"):
        build_encoder(encoder_cfg(objective="temporal"), initial_encoder_state(encoder_cfg()))


def test_masked_objective_hides_a_fixed_share_of_patches_and_scores_only_those():
    from fed_ros.learning.fleet_encoder import FrameSampler, build_encoder, masked_loss

    cfg = encoder_cfg(objective="masked", mask_patch=8, mask_ratio=0.5)  # a 4 x 4 grid
    eps = synthetic_episodes(2, 6, "image", seed=3, image_size=SIZE)
    sampler = FrameSampler(eps, cfg, seed=0)
    frames, hidden = sampler.masked_batch(cfg.cameras[0], 16)
    assert hidden.shape == (16, 4, 4) and (hidden.sum(dim=(1, 2)) == 8).all()
    assert len({tuple(h.flatten().tolist()) for h in hidden}) > 1  # each frame its own mask
    model = build_encoder(cfg)
    outputs = []

    def keep(module, inputs, out):
        out.retain_grad()
        outputs.append(out)

    model.heads[cfg.cameras[0]].register_forward_hook(keep)
    masked_loss(model, frames, hidden, cfg.cameras[0]).backward()
    # The decoder's 16 x 16 image: each 4 x 4 block is one 8-px patch of the 32-px frame.
    grad = outputs[0].grad.abs().sum(dim=1)
    blocks = hidden.repeat_interleave(4, 1).repeat_interleave(4, 2)
    assert (grad[~blocks] == 0).all(), "a visible patch's reconstruction was scored"
    assert (grad[blocks] > 0).float().mean() > 0.99


def test_masked_settings_key_only_masked_stages():
    from fed_ros.bench.federation.encoder import stage_key

    data = robot_data(1)
    for objective, moves in (("proprio", False), ("masked", True)):
        a = stage_key(encoder_cfg(objective=objective), data, 0)
        b = stage_key(encoder_cfg(objective=objective, mask_ratio=0.75), data, 0)
        assert (a != b) is moves, objective
    assert "mask_ratio" not in encoder_cfg().identity()


def test_bench_stage_trains_before_the_policy_rounds_and_refreshes(tmp_path):
    from fed_ros.bench.federation.encoder import FleetEncoderStage

    data = robot_data(2)
    stage = FleetEncoderStage(encoder_cfg(rounds=2, refresh_every=3), tmp_path / "enc.safetensors")
    assert [stage.due(r) for r in range(7)] == [True, False, False, True, False, False, True]
    policy_cfg = stage.policy_config(PolicyConfig(**TINY_POLICY, vision_backbone="fleet"))
    robots = clients(policy_cfg, data)
    first = build_policy(policy_cfg).agentview_encoder.frozen
    rows = stage.run(robots, data)
    assert [r["encoder_round"] for r in rows] == [0, 1]
    assert rows[0]["frames"] == {"robot_0": 6, "robot_1": 16}
    assert rows[0]["bytes_per_robot"] > 0 and all(s > 0 for s in rows[0]["cpu_s"].values())
    # The rewritten file is what the next policy reads: a new frozen trunk, the new weights.
    second = build_policy(policy_cfg).agentview_encoder.frozen
    assert second is not first
    np.testing.assert_array_equal(
        second.trunk.backbone.conv3.weight.detach().numpy(), stage.state["backbone.conv3.weight"]
    )
    # And the policy trains on it in a round, through the same client.
    result = robots["robot_0"].fit(
        policy_to_state_dict(build_policy(policy_cfg)),
        RoundConfig(local_steps=2),
        data["robot_0"],
        0,
    )
    assert np.isfinite(result.metrics["loss_bc"])
    assert torch.get_num_threads() == 1


def test_bench_stage_is_trained_once_per_seed_and_loaded_identically_after(tmp_path):
    from fed_ros.bench.federation.encoder import EncoderStageStore, FleetEncoderStage

    data = robot_data(2)
    store = EncoderStageStore(tmp_path / "encoders")

    def run_stage(name, cfg, stage_data):
        stage = FleetEncoderStage(cfg, tmp_path / f"{name}.safetensors", store=store)
        policy_cfg = stage.policy_config(PolicyConfig(**TINY_POLICY, vision_backbone="fleet"))
        rows = stage.run(clients(policy_cfg, stage_data), stage_data)
        return stage, rows

    trained, rows = run_stage("first", encoder_cfg(rounds=2), data)
    assert not any(r.get("loaded") for r in rows)
    # Another cell of the seed: the same encoder, bit for bit, with the rows of its training.
    loaded, again = run_stage("second", encoder_cfg(rounds=2), data)
    assert all(r["loaded"] for r in again) and loaded.rounds_run == trained.rounds_run == 2
    assert [r["cpu_s"] for r in again] == [r["cpu_s"] for r in rows]
    assert loaded.state.keys() == trained.state.keys()
    for k, v in trained.state.items():
        np.testing.assert_array_equal(loaded.state[k], v, err_msg=k)
    assert (tmp_path / "first.safetensors").read_bytes() == (
        tmp_path / "second.safetensors"
    ).read_bytes()
    # Anything that changes the stage misses the store: another seed, other frames.
    _, other_seed = run_stage("third", encoder_cfg(rounds=2, seed=1), data)
    fewer = {rid: eps[:-1] if len(eps) > 1 else eps for rid, eps in data.items()}
    _, other_data = run_stage("fourth", encoder_cfg(rounds=2), fewer)
    assert not any(r.get("loaded") for r in other_seed + other_data)


@pytest.mark.sim
def test_bench_image_cell_with_the_fleet_encoder_runs_its_stage_first(tmp_path):
    import json

    from fed_ros.bench.federation import command as F

    out = tmp_path / "bench"
    argv = [
        *("--only", "image", "--methods", "fedavg", "--robots", "2", "--demos", "2"),
        *("--rounds", "1", "--local-steps", "2", "--eval-episodes", "1", "--jobs", "1"),
        *("--vision-backbone", "fleet", "--encoder-rounds", "1", "--encoder-steps", "2"),
        *("--tracking", "none", "--out", str(out)),
    ]
    assert F.main(argv) == 0
    cell = json.loads((out / "cells" / "cross_family_image__fedavg__s0__fleet.json").read_text())
    assert cell["profile"]["policy"]["vision_backbone"] == "fleet"
    (row,) = cell["encoder_rounds"]
    assert set(row["frames"]) == set(cell["robots"]) and all(row["frames"].values())
    assert len(cell["rounds"]) == 1 and cell["rollouts"]
    # The scratch trunk's cell of the same seed is a different file, never resumed as this one.
    assert not (out / "cells" / "cross_family_image__fedavg__s0.json").exists()


def test_bench_refuses_a_bad_encoder_size_naming_it(capsys):
    from fed_ros.bench.federation import command as F

    argv = ["--only", "image", "--vision-backbone", "fleet", "--encoder-steps", "0"]
    assert F.main([*argv, "--out", "/nonexistent/never_written"]) == 2
    assert "local_steps must be an int >= 1, got 0" in capsys.readouterr().err


def test_an_encoder_objective_keys_its_cells_apart_from_the_default_ones():
    from fed_ros.bench.federation.command import _parser as build_parser
    from fed_ros.bench.federation.image import few_image_profile, image_profile

    argv = ["--only", "few_image", "--vision-backbone", "fleet", "--seeds", "7"]
    default = image_profile(build_parser().parse_args(argv))
    temporal = image_profile(build_parser().parse_args([*argv, "--encoder-objective", "temporal"]))
    assert (
        default.backbone_suffix == "__fleet" and temporal.fleet_encoder["objective"] == "temporal"
    )
    assert temporal.backbone_suffix == "__fleet_temporal"
    assert few_image_profile(temporal, temporal).backbone_suffix == "__fleet_temporal"
    with pytest.raises(SystemExit):
        build_parser().parse_args([*argv, "--encoder-objective", "contrastive"])


def test_tracking_keys_fleet_cells_apart_and_plots_the_encoder_rounds():
    from fed_ros.bench.federation.tracking import cell_run_name, cell_scalars

    rec = {
        "setting": "few_demos_image",
        "method": "feddrman",
        "seed": 7,
        "profile": {"encoding": "float32", "policy": {"vision_backbone": "fleet"}},
        "rounds": [{"round": 0, "loss_bc": -3.0}],
        "encoder_rounds": [
            {
                "encoder_round": r,
                "loss_first": 1.0 / (r + 1),
                "loss_last": 0.5 / (r + 1),
                "bytes_per_robot": 507008,
                "cpu_s": {"robot_0": 4.0, "robot_1": 6.0},
            }
            for r in range(2)
        ],
    }
    assert cell_run_name(rec) == "few_demos_image__feddrman__s7__fleet"
    scratch = {**rec, "profile": {"encoding": "float32", "policy": {"kind": "image"}}}
    assert cell_run_name(scratch) == "few_demos_image__feddrman__s7"
    temporal = {**rec, "profile": {**rec["profile"], "fleet_encoder": {"objective": "temporal"}}}
    assert cell_run_name(temporal) == "few_demos_image__feddrman__s7__fleet_temporal"
    scalars = cell_scalars(rec)
    assert scalars[1]["encoder/loss_last"] == 0.25 and scalars[0]["train/loss_bc"] == -3.0
    assert scalars[0]["encoder/cpu_s_per_robot"] == 5.0
    assert scalars[0]["encoder/bytes_per_robot"] == 507008
