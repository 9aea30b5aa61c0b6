"""A pretrained backbone as a camera trunk: fine-tuned (a submodule that trains and
federates) or frozen (shared by every policy in the process, with cached per-frame features).

A frozen trunk is deliberately *not* a submodule of the policy: its ~12-22 M weights are the
same published file on every robot, so shipping them each round would only cost bytes, and
the trainer's teacher and student (deep copies) and each round's fresh policy reuse one
instance and its feature cache instead of reloading the file.
"""

from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F

from fed_ros.learning.backbones.files import find_weights, load_backbone, spec_of

# Both backbones were pretrained on images normalised with ImageNet's channel statistics
# (torchvision's IMAGENET1K_V1 transforms; dinov2's IMAGENET_DEFAULT_MEAN/STD).
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


class PretrainedTrunk(nn.Module):
    """Images (N, 3, H, W) in [0, 1] -> resized to ``input_size``, ImageNet-normalised ->
    the backbone's feature map (N, C, h, w)."""

    mean: torch.Tensor  # buffers (register_buffer below), declared for the type checker
    std: torch.Tensor

    def __init__(self, name: str, weights: str | Path | None, input_size: int) -> None:
        super().__init__()
        spec = spec_of(name)
        if input_size < spec.min_size or input_size % spec.patch:
            raise ValueError(
                f"{name} input size must be a multiple of {spec.patch} >= {spec.min_size}, "
                f"got {input_size}"
            )
        self.input_size = input_size
        self.out_channels = spec.out_channels
        self.backbone = load_backbone(name, weights)
        # Not persistent: constants, not weights; the state dict holds only the backbone.
        self.register_buffer("mean", torch.tensor(IMAGENET_MEAN)[:, None, None], False)
        self.register_buffer("std", torch.tensor(IMAGENET_STD)[:, None, None], False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.backbone(backbone_input(x, self.input_size, self.mean, self.std))


def backbone_input(
    x: torch.Tensor, size: int, mean: torch.Tensor, std: torch.Tensor
) -> torch.Tensor:
    """Images (N, 3, H, W) in [0, 1] resized to ``size`` and normalised with (mean, std):
    what every backbone sees, also while the fleet encoder trains, so the frozen trunk
    reproduces its training input exactly."""
    if x.shape[-2:] != (size, size):
        x = F.interpolate(
            x, size=(size, size), mode="bilinear", antialias=True, align_corners=False
        )
    return (x - mean) / std


class FrozenTrunk:
    """A :class:`PretrainedTrunk` in eval mode without gradients, with a bounded LRU cache
    of per-frame features keyed by the frame's bytes (thread-safe).

    Frozen features of a frame never change, so each distinct frame is encoded once per
    process while it stays among the ``cache_frames`` most recently used. Deep copies
    return the same instance: a policy's copy (the trainer's teacher) shares trunk and cache.
    One made by :func:`frozen_trunk` pickles as that call, so a pickled policy unpickles
    onto the receiving process's own shared trunk (its weights file, its cache).
    """

    def __init__(
        self, trunk: PretrainedTrunk, cache_frames: int, source: tuple | None = None
    ) -> None:
        if not isinstance(cache_frames, int) or cache_frames < 0:
            raise ValueError(f"cache_frames must be an int >= 0, got {cache_frames!r}")
        self.trunk = trunk.eval().requires_grad_(False)
        self.out_channels = trunk.out_channels
        self.cache_frames = cache_frames
        self.hits = 0
        self.misses = 0
        self._cache: OrderedDict[tuple, torch.Tensor] = OrderedDict()
        self._lock = threading.Lock()
        self._source = source

    def __deepcopy__(self, memo: dict) -> "FrozenTrunk":
        return self

    def __reduce__(self) -> tuple:
        if self._source is None:
            raise TypeError("only a FrozenTrunk made by frozen_trunk() can be pickled")
        return frozen_trunk, self._source

    def clear(self) -> None:
        """Forget every cached feature and zero the hit and miss counts."""
        with self._lock:
            self._cache.clear()
            self.hits = self.misses = 0

    def _encode(self, x: torch.Tensor) -> torch.Tensor:
        with self._lock:
            if next(self.trunk.parameters()).device != x.device:
                self.trunk.to(x.device)
        with torch.no_grad():
            return self.trunk(x).float()

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """Feature maps (N, C, h, w) of images x (N, 3, H, W) in [0, 1]; no gradient."""
        if not self.cache_frames:
            return self._encode(x)
        host = x.detach().to("cpu", torch.float32).contiguous().numpy()
        keys = [
            (frame.shape, hashlib.blake2b(frame.tobytes(), digest_size=16).digest())
            for frame in host
        ]
        with self._lock:
            found = {k: self._cache[k] for k in keys if k in self._cache}
            for k in found:
                self._cache.move_to_end(k)
        todo = [i for i, k in enumerate(keys) if k not in found]
        fresh = {}
        if todo:
            feats = self._encode(x[todo])
            # Clone each row: a view would keep the whole batch's storage alive in the cache.
            fresh = {keys[i]: f.clone() for i, f in zip(todo, feats)}
        with self._lock:
            self.hits += len(keys) - len(todo)
            self.misses += len(todo)
            for k, f in fresh.items():
                self._cache[k] = f
            while len(self._cache) > self.cache_frames:
                self._cache.popitem(last=False)
        out = [found[k] if k in found else fresh[k] for k in keys]
        return torch.stack([f.to(x.device) for f in out])


_FROZEN: dict[tuple, FrozenTrunk] = {}
_FROZEN_LOCK = threading.Lock()


def frozen_trunk(
    name: str, weights: str | Path | None, input_size: int, cache_frames: int
) -> FrozenTrunk:
    """The process's shared frozen trunk for this backbone, weights file (while unchanged),
    input size and cache bound; built and loaded on first use."""
    path = find_weights(name, weights).resolve()
    stat = path.stat()
    key = (name, str(path), stat.st_mtime_ns, stat.st_size, input_size, cache_frames)
    with _FROZEN_LOCK:
        if key not in _FROZEN:
            trunk = PretrainedTrunk(name, path, input_size)
            source = (name, weights, input_size, cache_frames)
            _FROZEN[key] = FrozenTrunk(trunk, cache_frames, source)
        return _FROZEN[key]


def forget_frozen(weights: str | Path) -> int:
    """Drop every shared frozen trunk read from ``weights`` (and its cache); the count dropped.

    A file rewritten in place (the fleet encoder after a refresh) gets a new trunk on the
    next build anyway (keyed by modification time and size); this frees the old ones'
    caches, which would otherwise stay for the life of the process.
    """
    path = str(Path(weights).expanduser().resolve())
    with _FROZEN_LOCK:
        stale = [key for key in _FROZEN if key[1] == path]
        for key in stale:
            del _FROZEN[key]
    return len(stale)
