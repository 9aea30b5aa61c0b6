"""Descriptors: FeDepth Gaussian, RND novelty, penultimate embeddings."""
from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
import torch

from fed_ros.learning.configuration_policy import PolicyConfig
from fed_ros.learning.dataset import synthetic_episodes
from fed_ros.learning.descriptors import gaussian_descriptor, gem_pool, penultimate_embeddings
from fed_ros.learning.rnd_descriptor import (load_rnd_predictor, rnd_novelty, rnd_residual_std,
                                             train_rnd_predictor)
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
    code = ("import numpy as np, sys;"
            "from fed_ros.learning.dataset import synthetic_episodes as s;"
            "from fed_ros.learning.descriptors import gaussian_descriptor as g;"
            "m, v = g(s(2, 8, 'image', seed=4, image_size=32), n_frames=8);"
            "sys.stdout.write(np.concatenate([m, v]).tobytes().hex())")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    m, v = gaussian_descriptor(synthetic_episodes(2, 8, "image", seed=4, image_size=32), n_frames=8)
    assert bytes.fromhex(out.stdout) == np.concatenate([m, v]).tobytes()


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
    assert all(torch.equal(v, again[k]) for k, v in load_rnd_predictor(blob)[0].state_dict().items())


def test_rnd_payload_is_validated():
    blob = train_rnd_predictor(synthetic_episodes(1, 8), seed=0, steps=2)
    predictor, models = load_rnd_predictor(blob)
    assert models.mode == "lowdim"
    with pytest.raises(ValueError):
        load_rnd_predictor(b"not safetensors")
    with pytest.raises(ValueError):
        load_rnd_predictor(blob[:40])


def test_penultimate_embeddings_shape_and_argument_orders():
    cfg = PolicyConfig(kind="lowdim", embed_dim=32, window=3, transformer_layers=1,
                       transformer_heads=2, transformer_ff=64, dropout=0.0, text_dim=64)
    sd = policy_to_state_dict(build_policy(cfg, seed=0))
    eps = synthetic_episodes(2, 10)
    emb = penultimate_embeddings(sd, cfg, eps)
    assert emb.shape == (20, 32) and emb.dtype == np.float32
    assert np.array_equal(penultimate_embeddings(sd, eps, cfg), emb)
    assert penultimate_embeddings(sd, cfg, eps, max_windows=5).shape == (5, 32)


def test_penultimate_embeddings_include_failed_episodes():
    cfg = PolicyConfig(kind="lowdim", embed_dim=32, window=3, transformer_layers=1,
                       transformer_heads=2, transformer_ff=64, dropout=0.0, text_dim=64)
    sd = policy_to_state_dict(build_policy(cfg, seed=0))
    (episode,) = synthetic_episodes(1, 6)
    episode.success = False
    assert penultimate_embeddings(sd, cfg, [episode]).shape == (6, 32)
