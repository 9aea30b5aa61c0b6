"""Descriptors: FeDepth Gaussian, RND novelty, penultimate embeddings."""

from __future__ import annotations

import dataclasses
import subprocess
import sys

import numpy as np
import pytest
import torch

from fed_ros.learning.configuration_policy import PolicyConfig
from fed_ros.learning.dataset import synthetic_episodes
from fed_ros.learning.descriptors import (
    VARIANCE_FLOOR_FRACTION,
    gaussian_descriptor,
    gem_pool,
    image_feature_power,
    penultimate_embeddings,
    variance_floor,
)
from fed_ros.learning.rnd_descriptor import (
    RND_FORMAT,
    episode_folds,
    fit_rnd,
    load_rnd_predictor,
    lowdim_input_scale,
    rnd_novelty,
    rnd_residual_std,
    train_rnd_predictor,
)
from fed_ros.learning.modeling_policy import build_policy
from fed_ros.learning.weights import policy_to_state_dict


pytestmark = pytest.mark.usefixtures("torch_one_thread")


@pytest.mark.parametrize("kind", ["image", "lowdim"])
def test_gaussian_descriptor_of_identical_data_is_identical(kind):
    eps = synthetic_episodes(3, 12, kind, seed=0, image_size=48)
    copy = synthetic_episodes(3, 12, kind, seed=0, image_size=48)  # another robot, same data
    m1, v1 = gaussian_descriptor(eps, n_frames=16, seed=0)
    torch.manual_seed(123)  # the global RNG state must not matter
    np.random.seed(5)
    m2, v2 = gaussian_descriptor(copy, n_frames=16, seed=0)
    assert np.array_equal(m1, m2) and np.array_equal(v1, v2)
    assert np.all(v1 > 0) and np.all(np.isfinite(m1))
    shifted = synthetic_episodes(3, 12, kind, seed=0, image_size=48, shift=0.5)
    m3, _ = gaussian_descriptor(shifted, n_frames=16, seed=0)
    assert not np.allclose(m1, m3)


def test_gaussian_descriptor_identical_in_a_separate_process():
    code = (
        "import numpy as np, sys;"
        "from fed_ros.learning.dataset import synthetic_episodes as s;"
        "from fed_ros.learning.descriptors import gaussian_descriptor as g;"
        "m, v = g(s(2, 8, 'image', seed=4, image_size=32), n_frames=8);"
        "sys.stdout.write(np.concatenate([m, v]).tobytes().hex())"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    m, v = gaussian_descriptor(synthetic_episodes(2, 8, "image", seed=4, image_size=32), n_frames=8)
    assert bytes.fromhex(out.stdout) == np.concatenate([m, v]).tobytes()


def _jeffreys(a, b):
    from fed_ros.core.clustering.fedepth import jeffreys_matrix

    (ma, va), (mb, vb) = a, b
    return jeffreys_matrix(np.stack([ma, mb]), np.stack([va, vb]))[0, 1]


def test_near_constant_channels_do_not_dominate_the_jeffreys_divergence():
    """Constant data vs the same data with sub-millimetre jitter: practically one distribution.

    With raw-state ReLU features and an absolute 1e-8 variance floor, the floored variance of
    one robot against the tiny variance of the other gave Jeffreys terms of ~1e4 per channel;
    the relative floor keeps such channels near zero, far below a real distribution shift.
    """
    base = synthetic_episodes(3, 12, "lowdim", seed=0)
    first = {k: v[:1] for k, v in base[0].observations.items()}
    frozen = [
        dataclasses.replace(
            e, observations={k: np.repeat(first[k], len(v), 0) for k, v in e.observations.items()}
        )
        for e in base
    ]
    rng = np.random.default_rng(1)
    jitter = [
        dataclasses.replace(
            e,
            observations={
                k: (v + rng.normal(0, 1e-4, v.shape)).astype(np.float32)
                for k, v in e.observations.items()
            },
        )
        for e in frozen
    ]
    d_const, d_jitter = (
        gaussian_descriptor(frozen, n_frames=None),
        gaussian_descriptor(jitter, n_frames=None),
    )
    assert np.all(d_const[1] == variance_floor("lowdim"))  # constant channels sit at the floor
    assert _jeffreys(d_const, d_jitter) < 0.1
    moved = [
        dataclasses.replace(
            e, observations={k: v + np.float32(0.05) for k, v in e.observations.items()}
        )
        for e in frozen
    ]
    assert _jeffreys(d_const, gaussian_descriptor(moved, n_frames=None)) > 100 * _jeffreys(
        d_const, d_jitter
    )


def _work_cell(n: int, seed: int, shift: float = 0.0) -> list:
    """Synthetic low-dim demos at work-cell scale (objects spread over ~6 cm, like Lift),
    shifted."""
    return [
        dataclasses.replace(
            e,
            observations={
                k: (0.1 * v + shift).astype(np.float32) for k, v in e.observations.items()
            },
        )
        for e in synthetic_episodes(n, 20, "lowdim", seed=seed)
    ]


def test_gaussian_descriptor_separates_two_input_distributions():
    """Robots drawing from one distribution are much closer than robots from a shifted one."""
    a1, a2 = (gaussian_descriptor(_work_cell(8, seed)) for seed in (0, 1))
    b1, b2 = (gaussian_descriptor(_work_cell(8, seed, shift=0.03)) for seed in (2, 3))
    within = max(_jeffreys(a1, a2), _jeffreys(b1, b2))
    across = min(_jeffreys(x, y) for x in (a1, a2) for y in (b1, b2))
    assert across > 3 * within
    # Every low-dim channel is a bounded cosine: no dead channel, variance at least the floor.
    for m, v in (a1, b1):
        assert np.all(np.abs(m) <= 1.0) and np.all(v >= variance_floor("lowdim"))


def test_image_variance_floor_is_a_fixed_fraction_of_the_feature_scale():
    eps = synthetic_episodes(2, 6, "image", seed=0, image_size=32)
    m, v = gaussian_descriptor(eps, n_frames=8)
    floor = variance_floor("image", (32, 32))
    assert floor == pytest.approx(VARIANCE_FLOOR_FRACTION["image"] * image_feature_power(32, 32))
    assert floor > 1e-6 and np.all(v >= floor)
    assert np.median(v) > floor  # the floor lifts dead channels, not every channel
    with pytest.raises(ValueError, match="mode"):
        variance_floor("depth")


def test_gem_pooling_interpolates_between_mean_and_max():
    x = torch.tensor([[[[1.0, 3.0], [0.0, 4.0]]]], dtype=torch.float64)
    assert gem_pool(x, p=1.0).item() == pytest.approx(2.0, rel=1e-4)
    assert 2.0 < gem_pool(x, p=3.0).item() < 4.0
    with pytest.raises(ValueError, match="p"):
        gem_pool(x, p=0.0)


@pytest.mark.parametrize("kind", ["lowdim", "image"])
def test_rnd_novelty_lower_on_own_distribution_than_on_shifted(kind):
    own = synthetic_episodes(4, 20, kind, seed=0, image_size=32)
    shifted = synthetic_episodes(4, 20, kind, seed=0, image_size=32, shift=0.6)
    blob = train_rnd_predictor(own, seed=0, steps=150)
    assert isinstance(blob, bytes)
    s_own, s_shift = rnd_novelty(blob, own), rnd_novelty(blob, shifted)
    assert s_own < 0.5 * s_shift
    assert rnd_residual_std(blob, own) > 0.0
    again = load_rnd_predictor(train_rnd_predictor(own, seed=0, steps=150))[0].state_dict()
    assert all(
        torch.equal(v, again[k]) for k, v in load_rnd_predictor(blob)[0].state_dict().items()
    )


def test_rnd_payload_is_validated():
    blob = train_rnd_predictor(synthetic_episodes(1, 8), seed=0, steps=2)
    predictor, models = load_rnd_predictor(blob)
    assert models.mode == "lowdim"
    with pytest.raises(ValueError):
        load_rnd_predictor(b"not safetensors")
    with pytest.raises(ValueError):
        load_rnd_predictor(blob[:40])


@pytest.mark.parametrize("kind", ["lowdim", "image"])
def test_rnd_held_out_self_novelty_matches_a_same_distribution_peer(kind):
    """s_ii on held-out episodes is what a same-distribution peer's predictor scores on our
    frames; a shifted peer's predictor scores far above s_ii + sigma_i (eps = 1)."""
    own = synthetic_episodes(24, 10, kind, seed=0, image_size=32)
    same = synthetic_episodes(24, 10, kind, seed=1, image_size=32)
    shifted = synthetic_episodes(24, 10, kind, seed=2, image_size=32, shift=0.6)
    fit = fit_rnd(own, seed=0, steps=200)
    s_same = rnd_novelty(fit_rnd(same, seed=0, steps=200).predictor, own)
    s_shift = rnd_novelty(fit_rnd(shifted, seed=0, steps=200).predictor, own)
    assert fit.folds == 3 and fit.residual_std > 0.0
    assert 0.5 * fit.self_novelty < s_same < 2.0 * fit.self_novelty
    assert s_same <= fit.self_novelty + 1.0 * fit.residual_std
    assert s_shift > fit.self_novelty + 1.0 * fit.residual_std and s_shift > 2.0 * s_same
    # Why held out: on its own training frames the predictor looks far less novel than on
    # any unseen data, so s_ii + eps * sigma_i measured there rejects same-distribution peers.
    s_train = rnd_novelty(fit.predictor, own)
    assert s_train < fit.self_novelty and s_train < s_same


def test_fit_rnd_is_deterministic_by_seed():
    eps = synthetic_episodes(5, 12, "lowdim", seed=3)
    a, b = fit_rnd(eps, seed=4, steps=20), fit_rnd(eps, seed=4, steps=20)
    assert (a.self_novelty, a.residual_std, a.folds) == (b.self_novelty, b.residual_std, b.folds)
    wa, wb = (load_rnd_predictor(f.predictor)[0].state_dict() for f in (a, b))
    assert all(torch.equal(v, wb[k]) for k, v in wa.items())  # (safetensors header order may vary)
    c = fit_rnd(eps, seed=5, steps=20)
    assert c.self_novelty != a.self_novelty


def test_episode_folds_hold_out_every_episode_once():
    for n in (2, 3, 7):
        folds = episode_folds(n, seed=0)
        assert len(folds) == min(3, n) and all(len(f) >= 1 for f in folds)
        assert sorted(i for f in folds for i in f) == list(range(n))
        assert folds == episode_folds(n, seed=0)
    assert episode_folds(7, seed=0) != episode_folds(7, seed=1)
    with pytest.raises(ValueError, match="episodes"):
        episode_folds(1, seed=0)
    with pytest.raises(ValueError, match="folds"):
        episode_folds(4, seed=0, folds=1)


def test_fit_rnd_splits_a_single_episode_into_time_blocks():
    fit = fit_rnd(synthetic_episodes(1, 12), seed=0, steps=5)
    assert fit.folds == 3 and np.isfinite(fit.self_novelty) and fit.residual_std >= 0.0
    with pytest.raises(ValueError, match="frame"):
        fit_rnd(synthetic_episodes(1, 1), seed=0, steps=5)
    with pytest.raises(ValueError, match="episode"):
        fit_rnd([], seed=0)


def test_rnd_lowdim_units_follow_the_object_state_layout():
    from fed_ros.learning import rnd_descriptor as R
    from fed_ros.sim.experts import OBJECT_FIELDS, OBJECT_STRIDE

    assert R.OBJECT_STRIDE == OBJECT_STRIDE
    assert R.OBJECT_QUAT_SLOTS == range(OBJECT_FIELDS["quat"].start, OBJECT_FIELDS["quat"].stop)
    scale = lowdim_input_scale().numpy()
    assert (
        scale[:3].tolist() == [R.RND_LENGTH_M] * 3 and scale[3:7].tolist() == [1.0] * 4
    )  # object pos, quat
    assert scale[13:17].tolist() == [1.0] * 4 and scale[20:23].tolist() == [R.RND_LENGTH_M] * 3


def test_rnd_rejects_predictors_of_another_format():
    from safetensors.torch import save as st_save

    blob = train_rnd_predictor(synthetic_episodes(1, 8), seed=0, steps=2)
    predictor, _ = load_rnd_predictor(blob)
    old = st_save(
        {k: v.contiguous() for k, v in predictor.state_dict().items()},
        metadata={"mode": "lowdim", "target_seed": "7002", "format": "fed_ros.rnd.v1"},
    )
    assert RND_FORMAT != "fed_ros.rnd.v1"
    with pytest.raises(ValueError, match="format"):
        load_rnd_predictor(old)


def test_penultimate_embeddings_shape_and_argument_orders():
    cfg = PolicyConfig(
        kind="lowdim",
        embed_dim=32,
        window=3,
        transformer_layers=1,
        transformer_heads=2,
        transformer_ff=64,
        dropout=0.0,
        text_dim=64,
    )
    sd = policy_to_state_dict(build_policy(cfg, seed=0))
    eps = synthetic_episodes(2, 10)
    emb = penultimate_embeddings(sd, cfg, eps)
    assert emb.shape == (20, 32) and emb.dtype == np.float32
    assert np.array_equal(penultimate_embeddings(sd, eps, cfg), emb)
    assert penultimate_embeddings(sd, cfg, eps, max_windows=5).shape == (5, 32)


def test_penultimate_embeddings_include_failed_episodes():
    cfg = PolicyConfig(
        kind="lowdim",
        embed_dim=32,
        window=3,
        transformer_layers=1,
        transformer_heads=2,
        transformer_ff=64,
        dropout=0.0,
        text_dim=64,
    )
    sd = policy_to_state_dict(build_policy(cfg, seed=0))
    (episode,) = synthetic_episodes(1, 6)
    episode.success = False
    assert penultimate_embeddings(sd, cfg, [episode]).shape == (6, 32)
