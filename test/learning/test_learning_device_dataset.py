"""The GPU data path (issue 23 item 5) on CPU: `DeviceDataset` builds on the device the very
batches `DemoDataset` builds on the host (same keys, dtypes, values), and training with the data
on the device gives the same model as training from host batches."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fed_ros.learning.configuration_policy import PolicyConfig
from fed_ros.learning.configuration_trainer import TrainerConfig
from fed_ros.learning.dataset import DemoDataset, synthetic_episodes
from fed_ros.learning.device_dataset import DeviceDataset
from fed_ros.learning.trainer import initial_state_dict, train_local


@pytest.mark.parametrize("kind", ["lowdim", "image"])
def test_device_batches_equal_host_batches(kind):
    cfg = PolicyConfig(kind=kind, image_size=32, window=3)
    data = DemoDataset(synthetic_episodes(3, 15, kind, image_size=32), cfg)
    on_device = DeviceDataset(data, "cpu")
    assert len(on_device) == len(data) and on_device.nbytes > 0
    for idx in ([0, 1, 2], [44, 3, 17, 3, 30], list(range(len(data)))):
        host, dev = data.torch_batch(idx), on_device.torch_batch(idx)
        assert host.keys() == dev.keys()
        for key in host:
            assert host[key].dtype == dev[key].dtype, key
            assert torch.equal(host[key], dev[key]), key
    if kind == "image":
        assert on_device.obs["agentview_image"].dtype == torch.uint8  # frames stay uint8
    with pytest.raises(ValueError, match="indices must be 1-D"):
        on_device.torch_batch([len(data)])
    with pytest.raises(ValueError, match="lives on cpu"):
        on_device.torch_batch([0], device="meta")


def test_training_with_the_data_on_the_device_gives_the_same_model():
    cfg = PolicyConfig(kind="image", image_size=32, window=2, random_shift=2)
    eps = synthetic_episodes(3, 12, "image", image_size=32)
    start = initial_state_dict(cfg, seed=0, episodes=eps)
    results = {
        mode: train_local(
            start,
            eps,
            cfg,
            TrainerConfig(
                device="cpu",
                max_steps=3,
                batch_size=8,
                progress=False,
                data_on_device=mode,
                val_fraction=0.0,
            ),
        )
        for mode in ("off", "on")
    }
    for name, value in results["off"].params.items():
        assert np.array_equal(value, results["on"].params[name]), name
    with pytest.raises(ValueError, match="data_on_device must be one of"):
        TrainerConfig(data_on_device="gpu")


def test_the_data_path_benchmark_measures_both_paths_side_by_side(capsys):
    from fed_ros.bench.train_data_path import data_path_rows, print_data_path

    rows = data_path_rows(torch.device("cpu"), (4,), steps=1, episodes=2)
    assert [r["path"] for r in rows] == ["host", "device"]
    assert all(r["build_windows_per_s"] > 0 and r["step_windows_per_s"] > 0 for r in rows)
    print_data_path(rows, torch.device("cpu"))
    assert "x host" in capsys.readouterr().out
