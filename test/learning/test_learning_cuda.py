"""CUDA path (selected by device detection, same code as CPU); skipped where no GPU exists."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fed_ros.learning.configuration_policy import PolicyConfig
from fed_ros.learning.dataset import synthetic_episodes
from fed_ros.learning.device import resolve_device
from fed_ros.learning.runner import PolicyRunner
from fed_ros.learning.configuration_trainer import TrainerConfig
from fed_ros.learning.trainer import initial_state_dict, train_local

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


@pytest.mark.parametrize("kind", ["lowdim", "image"])
def test_auto_device_trains_on_cuda_with_amp_and_runner_acts(kind):
    assert resolve_device("auto").type == "cuda"
    cfg = PolicyConfig(kind=kind, image_size=32, window=3)
    eps = synthetic_episodes(4, 20, kind, image_size=32)
    start = initial_state_dict(cfg, seed=0, episodes=eps)
    # 4 episodes of 20 steps, one held out for validation: ~60 windows, 4 batches of 16 an
    # epoch. Two epochs allow 8 steps, so max_steps=5 is what stops training (one epoch stops
    # at 4, which is what this test asserted wrongly before it ever ran on a GPU).
    tc = TrainerConfig(device="auto", max_steps=5, epochs=2, batch_size=16, progress=False)
    result = train_local(start, eps, cfg, tc)
    assert result.metrics["steps"] == 5
    assert all(np.isfinite(v).all() and v.dtype == np.float32 for v in result.params.values())
    assert np.isfinite(result.metrics["loss_sub_text"]) and np.isfinite(result.metrics["loss_act"])
    runner = PolicyRunner(result.params, cfg, device="auto", instruction=eps[0].instruction)
    action = runner.act({k: v[0] for k, v in eps[0].observations.items()})
    assert action.shape == (4,) and np.all(np.abs(action) <= 1.0)
