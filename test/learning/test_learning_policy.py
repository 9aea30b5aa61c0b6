"""Policy construction, fixed manifests, features, weights round trip, runner, text encoder."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fed_ros.core.data import episode as ep
from fed_ros.learning.configuration_policy import PolicyConfig
from fed_ros.learning.dataset import DemoDataset, synthetic_episodes
from fed_ros.learning.modeling_policy import build_policy
from fed_ros.learning.runner import PolicyRunner
from fed_ros.learning.text import encode_instruction
from fed_ros.learning.weights import (
    load_checkpoint,
    load_state_dict_into,
    policy_to_state_dict,
    read_checkpoint_config,
    save_checkpoint,
    state_dict_from_bytes,
    state_dict_to_bytes,
)


pytestmark = pytest.mark.usefixtures("torch_one_thread")

TINY = dict(
    embed_dim=32,
    window=3,
    transformer_layers=1,
    transformer_heads=2,
    transformer_ff=64,
    dropout=0.0,
    text_dim=64,
    conv_channels=(8, 16),
    num_keypoints=8,
    image_size=32,
)


def tiny(kind: str, **kw) -> PolicyConfig:
    return PolicyConfig(kind=kind, **{**TINY, **kw})


@pytest.mark.parametrize(
    "field,value",
    [
        ("kind", "rgb"),
        ("window", 0),
        ("num_modes", -1),
        ("dropout", 1.0),
        ("min_std", 0.0),
        ("action_dim", 7),
        ("object_state_dim", 10),
        ("transformer_heads", 3),
    ],
)
def test_config_rejects_bad_field_naming_it(field, value):
    with pytest.raises(ValueError, match=field):
        PolicyConfig(**{field: value})


def test_config_dict_round_trip_and_unknown_key():
    cfg = tiny("image")
    assert PolicyConfig.from_dict(cfg.to_dict()) == cfg
    with pytest.raises(ValueError, match="bogus"):
        PolicyConfig.from_dict({"bogus": 1})


@pytest.mark.parametrize("kind", ["lowdim", "image"])
def test_manifest_is_fixed_and_independent_of_task(kind):
    cfg = tiny(kind)
    a = policy_to_state_dict(build_policy(cfg, seed=0))
    b = policy_to_state_dict(build_policy(cfg, seed=1))
    assert [(k, v.shape) for k, v in a.items()] == [(k, v.shape) for k, v in b.items()]
    assert all(v.dtype == np.float32 for v in a.values())
    assert any(k.startswith("temporal.") for k in a) and any(k.startswith("head.") for k in a)
    # Training on different tasks needs no change of the model: same cfg, same manifest.
    for task in ("lift", "stack"):
        data = DemoDataset(
            synthetic_episodes(2, 6, kind, task=task, image_size=32, instruction=f"do {task}"), cfg
        )
        loss, _ = build_policy(cfg, seed=0)(data.torch_batch(np.arange(4)))
        assert torch.isfinite(loss)


def test_lowdim_and_image_share_transformer_and_head_names():
    low = policy_to_state_dict(build_policy(tiny("lowdim"), seed=0))
    img = policy_to_state_dict(build_policy(tiny("image"), seed=0))
    shared = [k for k in low if k.startswith(("temporal.", "head."))]
    assert shared == [k for k in img if k.startswith(("temporal.", "head."))]


@pytest.mark.parametrize(
    "kind,mods",
    [
        ("lowdim", ("text", "object", "eef", "joint", "gripper")),
        ("image", ("text", "agentview", "wrist", "joint", "gripper")),
    ],
)
def test_features_expose_every_modality(kind, mods):
    cfg = tiny(kind)
    data = DemoDataset(synthetic_episodes(2, 5, kind, image_size=32), cfg)
    feats = build_policy(cfg, seed=0).features(data.torch_batch(np.arange(4)))
    assert tuple(feats) == mods
    assert all(f.shape == (4, cfg.window, cfg.embed_dim) for f in feats.values())


def test_wrong_image_size_is_rejected():
    cfg = tiny("image")
    with pytest.raises(ValueError, match="image_size"):
        DemoDataset(synthetic_episodes(1, 4, "image", image_size=48), cfg)


def test_state_dict_round_trip_is_exact(tmp_path):
    cfg = tiny("image")
    sd = policy_to_state_dict(build_policy(cfg, seed=3))
    path = save_checkpoint(tmp_path / "m.safetensors", sd, policy_cfg=cfg)
    back = load_checkpoint(path)
    assert list(back) == list(sd)
    assert all(np.array_equal(back[k], sd[k]) for k in sd)
    assert read_checkpoint_config(path) == cfg
    blob = state_dict_from_bytes(state_dict_to_bytes(sd))
    assert list(blob) == list(sd) and all(np.array_equal(blob[k], sd[k]) for k in sd)
    model = load_state_dict_into(build_policy(cfg, seed=9), back)
    again = policy_to_state_dict(model)
    assert all(np.array_equal(again[k], sd[k]) for k in sd)


def test_load_rejects_bad_state_dicts():
    cfg = tiny("lowdim")
    model = build_policy(cfg, seed=0)
    sd = policy_to_state_dict(model)
    name = next(iter(sd))
    with pytest.raises(ValueError, match="missing"):
        load_state_dict_into(model, {k: v for k, v in sd.items() if k != name})
    with pytest.raises(ValueError, match=name):
        load_state_dict_into(model, {**sd, name: np.zeros((1, 2), np.float32)})
    with pytest.raises(ValueError, match="NaN"):
        load_state_dict_into(model, {**sd, name: np.full_like(sd[name], np.nan)})
    with pytest.raises(ValueError, match="unexpected"):
        load_state_dict_into(model, {**sd, "extra.weight": np.zeros(1, np.float32)})


@pytest.mark.parametrize("kind", ["lowdim", "image"])
def test_runner_acts_with_window_history_and_reset(kind):
    cfg = tiny(kind)
    episode = synthetic_episodes(1, 6, kind, image_size=32)[0]
    sd = policy_to_state_dict(build_policy(cfg, seed=0))
    runner = PolicyRunner(sd, cfg, device="cpu", instruction=episode.instruction)
    obs = [{k: v[t] for k, v in episode.observations.items()} for t in range(4)]
    first = [runner.act(o) for o in obs]
    assert all(a.shape == (ep.ACTION_DIM,) and a.dtype == np.float32 for a in first)
    assert all(np.all(np.abs(a) <= 1.0) for a in first)
    runner.reset()
    again = [runner.act({**o, "instruction": episode.instruction}) for o in obs]
    assert all(np.allclose(a, b, atol=1e-6) for a, b in zip(first, again))
    # The closed-loop action equals the batch forward on the same (padded) window.
    data = DemoDataset([episode], cfg)
    model = load_state_dict_into(build_policy(cfg, seed=0), sd).eval()
    out = model.compute(data.torch_batch([3])).gmm
    mode = out.logits[0, -1].argmax()
    assert np.allclose(first[3], out.means[0, -1, mode].clamp(-1, 1).detach().numpy(), atol=1e-5)


def test_runner_requires_instruction_and_observations():
    cfg = tiny("lowdim")
    runner = PolicyRunner(policy_to_state_dict(build_policy(cfg, seed=0)), cfg, device="cpu")
    obs = {k: v[0] for k, v in synthetic_episodes(1, 2)[0].observations.items()}
    with pytest.raises(ValueError, match="instruction"):
        runner.act(obs)
    runner.set_instruction("lift")
    del obs[ep.OBJECT_STATE]
    with pytest.raises(ValueError, match=ep.OBJECT_STATE):
        runner.act(obs)


def test_text_encoder_is_deterministic_normalised_and_meaningful():
    a = encode_instruction("lift the red cube", 256)
    assert a.dtype == np.float32 and a.shape == (256,)
    assert np.linalg.norm(a) == pytest.approx(1.0, abs=1e-5)
    assert np.array_equal(a, encode_instruction("Lift the red cube", 256))
    near = encode_instruction("lift the red cubes", 256) @ a
    far = encode_instruction("stack the green block on the plate", 256) @ a
    assert near > far + 0.3
    # Fixed values guard against accidental changes of the fleet-wide encoder.
    assert np.allclose(encode_instruction("pick", 4), encode_instruction("pick", 4))
    with pytest.raises(ValueError, match="dim"):
        encode_instruction("x", 0)


def test_film_conditions_image_features_on_the_instruction():
    cfg = tiny("image")
    data = DemoDataset(synthetic_episodes(1, 4, "image", image_size=32), cfg)
    model = build_policy(cfg, seed=0)
    batch = data.torch_batch(np.arange(2))
    other = {
        **batch,
        "text": torch.from_numpy(np.stack([encode_instruction("stack blocks", 64)] * 2)),
    }
    with torch.no_grad():
        a, b = model.features(batch), model.features(other)
    assert not torch.allclose(a["agentview"], b["agentview"])
    assert torch.equal(a["joint"], b["joint"])  # proprio encoders are not text-conditioned


def test_image_trainer_shares_augmented_inputs_between_teacher_and_student():
    from fed_ros.learning.configuration_trainer import TrainerConfig
    from fed_ros.learning.trainer import LocalTrainer

    cfg = tiny("image", random_shift=4)
    eps = synthetic_episodes(2, 6, "image", image_size=32)
    trainer = LocalTrainer(
        policy_to_state_dict(build_policy(cfg, seed=0)),
        cfg,
        TrainerConfig(device="cpu", progress=False, rank=8),
    )
    batch = trainer.process_batch(DemoDataset(eps, cfg), np.arange(4))
    raw = DemoDataset(eps, cfg).batch(np.arange(4))[ep.AGENTVIEW_IMAGE]
    assert batch[ep.AGENTVIEW_IMAGE].dtype == torch.uint8
    assert not np.array_equal(batch[ep.AGENTVIEW_IMAGE].numpy(), raw)  # shifted
    losses = trainer._compute_losses(batch, *trainer.forward(batch))
    for m in cfg.modalities:
        assert losses[f"sub_{m}"].item() < 1e-6, m
    assert abs(losses["act"].item()) < 1e-5


def test_corrupt_checkpoints_and_payloads_raise_value_error(tmp_path):
    sd = policy_to_state_dict(build_policy(tiny("lowdim"), seed=0))
    path = save_checkpoint(tmp_path / "m.safetensors", sd)
    raw = bytearray(path.read_bytes())
    raw[8:40] = b"x" * 32  # destroy the JSON header
    bad = tmp_path / "bad.safetensors"
    bad.write_bytes(bytes(raw))
    with pytest.raises(ValueError, match="safetensors"):
        load_checkpoint(bad)
    with pytest.raises(ValueError, match="does not exist"):
        load_checkpoint(tmp_path / "missing.safetensors")
    with pytest.raises(ValueError, match="safetensors"):
        state_dict_from_bytes(bytes(raw))


# -- image trunk profiles, frame pooling, augmentation ------------------------------------


def test_image_profile_is_validated_and_sets_default_widths():
    with pytest.raises(ValueError, match="image_profile"):
        PolicyConfig(kind="image", image_profile="resnet18")
    assert PolicyConfig(kind="image").conv_channels == (16, 32)  # "lite", the CPU default
    gpu = PolicyConfig(kind="image", image_profile="resnet_t")
    assert gpu == PolicyConfig(kind="image", image_profile="resnet_t", conv_channels=(32, 32, 64))
    assert PolicyConfig.from_dict(gpu.to_dict()) == gpu
    with pytest.raises(ValueError, match="conv_channels"):
        PolicyConfig(kind="image", conv_channels=())


@pytest.mark.parametrize(
    "profile,stem,blocks", [("lite", (16, 3, 4, 4), 1), ("resnet_t", (32, 3, 5, 5), 2)]
)
def test_image_profiles_fix_the_trunk_and_the_manifest(profile, stem, blocks):
    cfg = PolicyConfig(kind="image", image_profile=profile)
    a = policy_to_state_dict(build_policy(cfg, seed=0))
    b = policy_to_state_dict(build_policy(PolicyConfig.from_dict(cfg.to_dict()), seed=5))
    assert [(k, v.shape) for k, v in a.items()] == [(k, v.shape) for k, v in b.items()]
    assert a["agentview_encoder.stem.0.weight"].shape == stem
    assert sum(k.endswith("conv1.weight") for k in a if k.startswith("wrist_encoder.")) == blocks


def _naive_batch(data: DemoDataset, idx: np.ndarray) -> dict:
    """The same windows with images laid out (B,T,H,W,3): every step's frame gathered."""
    batch = data.torch_batch(idx)
    win = data.window_index[idx]
    for key in ep.IMAGE_KEYS:
        batch[key] = torch.from_numpy(data.obs[key][win])
    del batch["image_index"], batch["image_episode"]
    return batch


def test_dataset_pools_each_distinct_frame_once():
    cfg = tiny("image")
    data = DemoDataset(synthetic_episodes(2, 8, "image", image_size=32), cfg)
    idx = np.array([0, 1, 2, 3, 9, 10])  # overlapping windows, padded episode starts
    batch = data.batch(idx)
    win = data.window_index[idx]
    assert len(batch[ep.AGENTVIEW_IMAGE]) == len(np.unique(win)) < win.size
    for key in ep.IMAGE_KEYS:
        assert np.array_equal(batch[key][batch["image_index"]], data.obs[key][win])
    assert np.array_equal(batch["image_episode"], data.frame_episode[np.unique(win)])


@pytest.mark.parametrize("profile", ["lite", "resnet_t"])
def test_pooled_encoding_equals_per_window_encoding(profile):
    cfg = tiny("image", image_profile=profile, conv_channels=None)
    eps = synthetic_episodes(1, 10, "image", image_size=32) + synthetic_episodes(
        1, 10, "image", seed=1, image_size=32, instruction="stack it"
    )
    data = DemoDataset(eps, cfg)
    idx = np.array([0, 1, 2, 4, 5, 11, 12, 13])  # both episodes, so FiLM sees both texts
    pooled, naive = data.torch_batch(idx), _naive_batch(data, idx)
    assert len(pooled[ep.WRIST_IMAGE]) < naive[ep.WRIST_IMAGE].shape[0] * cfg.window
    grads = []
    for batch in (pooled, naive):
        model = build_policy(cfg, seed=0)
        loss, info = model(batch)
        loss.backward()
        grads.append({n: p.grad.clone() for n, p in model.named_parameters()})
        feats = info["output"].features
        if batch is pooled:
            ref_feats, ref_loss = feats, loss
    for m in cfg.modalities:
        torch.testing.assert_close(feats[m], ref_feats[m], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(loss, ref_loss, rtol=1e-5, atol=1e-5)
    for name in grads[0]:
        torch.testing.assert_close(
            grads[0][name], grads[1][name], rtol=1e-4, atol=1e-5, msg=lambda s: f"{name}: {s}"
        )


def test_pooled_batch_is_checked():
    cfg = tiny("image")
    data = DemoDataset(synthetic_episodes(2, 6, "image", image_size=32), cfg)
    model = build_policy(cfg, seed=0)
    batch = data.torch_batch(np.array([0, 1, 7]))
    unused = {**batch, "image_index": torch.zeros_like(batch["image_index"])}
    with pytest.raises(ValueError, match="image_index"):
        model.features(unused)
    # Two windows sharing frames must share the instruction the frames are conditioned on.
    shared = data.torch_batch(np.array([2, 3]))
    other = shared["text"].clone()
    other[1] = torch.from_numpy(encode_instruction("stack blocks", 64))
    with pytest.raises(ValueError, match="instruction"):
        model.features({**shared, "text": other})


def _reference_shift(images: torch.Tensor, pad: int, gen: torch.Generator) -> torch.Tensor:
    """The textbook augmentation: replicate-pad in float, crop at one offset per sequence."""
    b, t, h, w, c = images.shape
    x = images.permute(0, 1, 4, 2, 3).reshape(b, t * c, h, w).float()
    x = torch.nn.functional.pad(x, (pad, pad, pad, pad), mode="replicate")
    offs = torch.randint(0, 2 * pad + 1, (b, 2), generator=gen)
    out = torch.stack(
        [x[i, :, oy : oy + h, ox : ox + w] for i, (oy, ox) in enumerate(offs.tolist())]
    )
    return out.reshape(b, t, c, h, w).permute(0, 1, 3, 4, 2).to(images.dtype)


def test_random_shift_equals_pad_and_crop_and_groups_share_a_shift():
    from fed_ros.learning.augmentation import random_shift

    images = torch.randint(0, 256, (6, 3, 12, 10, 3), dtype=torch.uint8)
    g1, g2 = torch.Generator().manual_seed(4), torch.Generator().manual_seed(4)
    shifted = random_shift(images, 3, g1)
    assert torch.equal(shifted, _reference_shift(images, 3, g2))
    assert not torch.equal(shifted, images)
    same = images[:1].expand(6, -1, -1, -1, -1).contiguous()  # one sequence six times
    out = random_shift(
        same, 3, torch.Generator().manual_seed(0), groups=torch.tensor([7, 7, 7, 2, 2, 9])
    )
    assert torch.equal(out[0], out[1]) and torch.equal(out[1], out[2])
    assert torch.equal(out[3], out[4])
    assert len({out[i].numpy().tobytes() for i in (0, 3, 5)}) > 1  # groups draw their own
    with pytest.raises(ValueError, match="groups"):
        random_shift(images, 3, None, groups=torch.tensor([0, 1]))
