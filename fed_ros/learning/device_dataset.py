"""Demonstration windows kept on the training device (issue 23 item 5, the GPU data path).

`DemoDataset.torch_batch` builds every batch on the host (numpy gathers and `np.unique`) and
copies it to the device; on a GPU that host work, not the model, bounds the step rate (measured
on an H200: 39.7 steps/s at batch 32 and 14.1 at batch 512 for the `lite` image policy, about
7,000 windows/s on an almost idle GPU). :class:`DeviceDataset` uploads the dataset's arrays once
(camera frames as uint8, everything else float32) and builds each batch there: the window gather,
the pool of distinct frames (`torch.unique`) and the random-shift augmentation
(:func:`fed_ros.learning.augmentation.random_shift`, applied by the trainer to the device batch)
run on the device; only the batch's frame indices cross from the host.

The batch is the same, value for value and key for key, as `DemoDataset.torch_batch` gives for
the same indices (tested on CPU), so training is unchanged; the trainer uses it when
``TrainerConfig.data_on_device`` says so (``auto``: on CUDA devices).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from fed_ros.core.data import episode as ep


class DeviceDataset:
    """A `DemoDataset`'s arrays on ``device``; :meth:`torch_batch` as the host dataset's."""

    def __init__(self, data: Any, device: torch.device | str) -> None:
        self.host = data  # the DemoDataset (length, stats, instructions stay there)
        self.cfg = data.cfg
        self.device = torch.device(device)
        dev = self.device
        self.obs = {
            k: torch.from_numpy(np.ascontiguousarray(v)).to(dev) for k, v in data.obs.items()
        }
        self.actions = torch.from_numpy(data.actions).to(dev)
        self.text = torch.from_numpy(np.ascontiguousarray(data.text)).to(dev)
        self.frame_episode = torch.from_numpy(data.frame_episode).to(dev)
        self.window_index = torch.from_numpy(data.window_index).to(dev)
        self.window_valid = torch.from_numpy(data.window_valid).to(dev)

    def __len__(self) -> int:
        return len(self.host)

    @property
    def stats(self) -> Any:
        """The host dataset's normalisation statistics."""
        return self.host.stats

    @property
    def nbytes(self) -> int:
        """Device bytes the dataset holds."""
        tensors = [*self.obs.values(), self.actions, self.text, self.frame_episode]
        tensors += [self.window_index, self.window_valid]
        return sum(t.numel() * t.element_size() for t in tensors)

    def torch_batch(
        self, indices: np.ndarray | Sequence[int], device: torch.device | str | None = None
    ) -> dict[str, torch.Tensor]:
        """Windows ending at the given frames, built on the device (``device`` must be this
        dataset's, or None)."""
        if device is not None and torch.device(device) != self.device:
            raise ValueError(f"this dataset lives on {self.device}, not {device}")
        idx_np = np.asarray(indices, dtype=np.int64)
        if idx_np.ndim != 1 or (len(idx_np) and (idx_np.min() < 0 or idx_np.max() >= len(self))):
            raise ValueError(f"indices must be 1-D in [0, {len(self)})")
        idx = torch.from_numpy(idx_np).to(self.device)
        win = self.window_index[idx]  # B,T
        out: dict[str, torch.Tensor] = {
            k: v[win] for k, v in self.obs.items() if k not in ep.IMAGE_KEYS
        }
        out["actions"] = self.actions[win]
        out["valid"] = self.window_valid[idx]
        out["text"] = self.text[self.frame_episode[idx]]
        if self.cfg.kind == "image":
            # As the host dataset: each distinct frame once (sorted), with each step's position.
            frames, inverse = torch.unique(win, sorted=True, return_inverse=True)
            for key in ep.IMAGE_KEYS:
                out[key] = self.obs[key][frames]
            out["image_index"] = inverse.reshape(win.shape)
            out["image_episode"] = self.frame_episode[frames]
        return out
