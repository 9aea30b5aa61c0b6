"""Find a backbone's published weights file on this machine and load it strictly.

Nothing is downloaded at run time: a robot may have no internet, and a fleet must not
depend on a download server mid-round. The file comes from ``PolicyConfig.backbone_weights``
(a path) or, when that is None, from the torch hub cache under the name torch.hub itself
gives it, so a file fetched once by ``torch.hub`` on any machine can be copied over as is.
"""

from __future__ import annotations

import functools
from pathlib import Path

import torch
import torch.nn as nn
from safetensors.torch import load_file as load_safetensors

from fed_ros.learning.backbones.dinov2 import DinoV2ViTS14
from fed_ros.learning.backbones.fleet import FleetConvNet
from fed_ros.learning.backbones.resnet import ResNet18
from fed_ros.learning.backbones.specs import BACKBONE_SPECS, BackboneSpec

_ARCHITECTURES: dict[str, type[nn.Module]] = {
    "resnet18_imagenet": ResNet18,
    "dinov2_vits14": DinoV2ViTS14,
    "fleet": FleetConvNet,
}
# torchvision's BatchNorm counter; FrozenStatsBatchNorm2d drops it on load.
_IGNORED_SUFFIX = ".num_batches_tracked"


def spec_of(name: str) -> BackboneSpec:
    """The spec of a pretrained backbone; ValueError naming an unknown one."""
    if name not in BACKBONE_SPECS:
        raise ValueError(f"unknown pretrained backbone {name!r}; known: {tuple(BACKBONE_SPECS)}")
    return BACKBONE_SPECS[name]


def hub_cache_path(name: str) -> Path:
    """Where torch.hub keeps the backbone's file: ``<torch.hub.get_dir()>/checkpoints/<file>``."""
    return Path(torch.hub.get_dir()) / "checkpoints" / spec_of(name).file_name


def find_weights(name: str, weights: str | Path | None = None) -> Path:
    """The weights file to read: ``weights`` if given, else the torch hub cache's copy.

    A missing file raises one FileNotFoundError naming the path looked at and how to get it.
    """
    spec = spec_of(name)
    if not spec.url and weights is None:
        raise FileNotFoundError(
            f"{name} has no published weights file: set backbone_weights to the file the "
            "fleet encoder stage wrote (fed_ros.learning.fleet_encoder.save_backbone)"
        )
    path = Path(weights).expanduser() if weights is not None else hub_cache_path(name)
    if path.is_file():
        return path
    if not spec.url:
        raise FileNotFoundError(
            f"{name} weights not found at {path} (backbone_weights); run the fleet encoder "
            "stage first: it writes this file (fed_ros.learning.fleet_encoder.save_backbone)"
        )
    source = "backbone_weights" if weights is not None else "the torch hub cache"
    raise FileNotFoundError(
        f"{name} weights not found at {path} ({source}); nothing is downloaded at run time. "
        f"On a machine with internet, download {spec.url} and copy it to "
        f"{hub_cache_path(name)} (the torch hub cache), or set backbone_weights to its path."
    )


@functools.lru_cache(maxsize=2)
def _read(path: str, mtime_ns: int, size: int) -> dict[str, torch.Tensor]:
    # Keyed by modification time and size too, so a replaced file is read again. Every
    # policy build (teacher, student, each round) loads the file; reading it is ~90 MB.
    del mtime_ns, size
    if path.endswith(".safetensors"):
        state = load_safetensors(path, device="cpu")
    else:
        # weights_only: a .pth is a pickle, and only tensors and containers may come out.
        state = torch.load(path, map_location="cpu", weights_only=True)
    if not isinstance(state, dict) or not all(
        isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in state.items()
    ):
        raise ValueError(f"{path} is not a state dict (a mapping of names to tensors)")
    return state


def read_weights(path: str | Path) -> dict[str, torch.Tensor]:
    """The state dict in a ``.safetensors`` or ``.pth`` file (read once while unchanged)."""
    path = Path(path)
    stat = path.stat()
    return _read(str(path), stat.st_mtime_ns, stat.st_size)


def load_published(module: nn.Module, state: dict[str, torch.Tensor], source: str) -> None:
    """Load ``state`` into ``module`` strictly; ValueError naming the first missing,
    unexpected or misshapen tensor and the file it came from."""
    own = module.state_dict()
    given = {k: v for k, v in state.items() if not k.endswith(_IGNORED_SUFFIX)}
    missing = [k for k in own if k not in given]
    unexpected = [k for k in given if k not in own]
    if missing:
        raise ValueError(f"{source} is missing tensor {missing[0]!r} ({len(missing)} missing)")
    if unexpected:
        raise ValueError(
            f"{source} has unexpected tensor {unexpected[0]!r} ({len(unexpected)} unexpected)"
        )
    for key, ref in own.items():
        if tuple(given[key].shape) != tuple(ref.shape):
            raise ValueError(
                f"{source}: tensor {key!r} has shape {tuple(given[key].shape)}, "
                f"expected {tuple(ref.shape)}"
            )
    module.load_state_dict(state, strict=True)


def load_backbone(name: str, weights: str | Path | None = None) -> nn.Module:
    """The named backbone with its published weights (strict load), without the tensors
    its feature map never uses."""
    path = find_weights(name, weights)
    module = _ARCHITECTURES[spec_of(name).name]()
    load_published(module, read_weights(path), str(path))
    module.drop_unused()
    return module
