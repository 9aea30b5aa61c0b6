"""ResNet-18 with torchvision's module names, so its published ImageNet state dict loads as is.

Layout (He et al. 2016; torchvision ``resnet18``): 7x7/2 conv ``conv1`` + ``bn1``, 3x3/2 max
pool, four stages ``layer1..layer4`` of two basic blocks each (64, 128, 256, 512 channels;
stages 2-4 open with stride 2 and a 1x1 ``downsample``), classifier ``fc``. The policy uses
the ``layer4`` feature map (stride 32: 84 px -> 3x3), as robomimic's ResNet18Conv does.
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F


class FrozenStatsBatchNorm2d(nn.Module):
    """BatchNorm that always normalises with its (ImageNet) running statistics.

    The affine ``weight`` and ``bias`` are parameters (they train when the backbone is
    fine-tuned); ``running_mean`` and ``running_var`` are float buffers that never change.
    Batch statistics would differ between robots and between the teacher and the student,
    and a policy batch of one task's frames is far from ImageNet's: keeping the published
    statistics makes the forward deterministic and leaves nothing non-trainable to average.
    """

    running_mean: torch.Tensor  # buffers (register_buffer below), declared for the type checker
    running_var: torch.Tensor

    def __init__(self, channels: int, eps: float = 1e-5) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(channels))
        self.bias = nn.Parameter(torch.zeros(channels))
        self.register_buffer("running_mean", torch.zeros(channels))
        self.register_buffer("running_var", torch.ones(channels))

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs) -> None:  # noqa: ANN001
        # torchvision's BatchNorm2d also saves ``num_batches_tracked``, the ImageNet run's
        # int64 batch counter: meaningless with frozen statistics, and the fleet's state
        # dicts are float-only (weights.policy_to_state_dict).
        state_dict.pop(prefix + "num_batches_tracked", None)
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        scale = self.weight * (self.running_var + self.eps).rsqrt()
        shift = self.bias - self.running_mean * scale
        return x * scale[None, :, None, None] + shift[None, :, None, None]


class BasicBlock(nn.Module):
    """Two 3x3 convs with a residual connection (1x1 ``downsample`` when the shape changes)."""

    def __init__(self, in_ch: int, out_ch: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(in_ch, out_ch, 3, stride, 1, bias=False)
        self.bn1 = FrozenStatsBatchNorm2d(out_ch)
        self.conv2 = nn.Conv2d(out_ch, out_ch, 3, 1, 1, bias=False)
        self.bn2 = FrozenStatsBatchNorm2d(out_ch)
        self.downsample = (
            nn.Sequential(
                nn.Conv2d(in_ch, out_ch, 1, stride, bias=False), FrozenStatsBatchNorm2d(out_ch)
            )
            if stride != 1 or in_ch != out_ch
            else None
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = F.relu(self.bn1(self.conv1(x)))
        h = self.bn2(self.conv2(h))
        skip = x if self.downsample is None else self.downsample(x)
        return F.relu(h + skip)


class ResNet18(nn.Module):
    """ResNet-18 (11,689,512 parameters with its 1000-class ``fc``); ``forward`` is the
    ``layer4`` feature map (N, 512, ceil(H/32), ceil(W/32)) of ImageNet-normalised images."""

    out_channels = 512

    def __init__(self, num_classes: int = 1000) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 64, 7, 2, 3, bias=False)
        self.bn1 = FrozenStatsBatchNorm2d(64)
        widths = (64, 128, 256, 512)
        prev = 64
        for i, width in enumerate(widths, start=1):
            stride = 1 if i == 1 else 2
            stage = nn.Sequential(BasicBlock(prev, width, stride), BasicBlock(width, width, 1))
            self.add_module(f"layer{i}", stage)
            prev = width
        self.fc: nn.Linear | None = nn.Linear(512, num_classes)

    def drop_unused(self) -> None:
        """Remove the ImageNet classifier: the policy reads the feature map, and a fine-tuned
        trunk should federate only what trains."""
        self.fc = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = F.relu(self.bn1(self.conv1(x)))
        h = F.max_pool2d(h, 3, 2, 1)
        for stage in (self.layer1, self.layer2, self.layer3, self.layer4):
            h = stage(h)
        return h  # N,512,h,w
