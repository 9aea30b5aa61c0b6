"""The fleet's own camera trunk: a small conv net whose weights the robots train together.

Unlike ResNet-18 or DINOv2 there is no published file: the fleet encoder stage
(``fed_ros.learning.fleet_encoder``) trains it on every frame the robots record, FedAvgs it
across the whole fleet and writes its ``.safetensors`` file, which a policy then reads
through the same frozen-trunk path as a published backbone (``vision_backbone="fleet"``).
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

# Widths of the three conv layers. The stem matches the policy's `lite` trunk (4x4, stride
# 4: 84 -> 21 px, then stride 2 -> 11x11), so a frozen fleet feature map has the scratch
# trunk's keypoint resolution at about twice its multiply-adds; 64 channels out.
WIDTHS = (16, 32, 64)


class FleetConvNet(nn.Module):
    """Conv stem (4x4/4) -> 3x3/2 -> 3x3/1, GroupNorm + ReLU after each; ``forward`` maps
    ImageNet-normalised images (N, 3, H, W) to a (N, 64, ~H/8, ~W/8) feature map."""

    out_channels = WIDTHS[-1]

    def __init__(self) -> None:
        super().__init__()
        w1, w2, w3 = WIDTHS
        self.conv1 = nn.Conv2d(3, w1, 4, 4)
        self.norm1 = nn.GroupNorm(4, w1)
        self.conv2 = nn.Conv2d(w1, w2, 3, 2, 1)
        self.norm2 = nn.GroupNorm(8, w2)
        self.conv3 = nn.Conv2d(w2, w3, 3, 1, 1)
        # GroupNorm, not BatchNorm: no running statistics that robots would disagree on.
        self.norm3 = nn.GroupNorm(8, w3)

    def drop_unused(self) -> None:
        """Nothing to drop (the published backbones' hook; every tensor here is used)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = F.relu(self.norm1(self.conv1(x)))
        h = F.relu(self.norm2(self.conv2(h)))
        return F.relu(self.norm3(self.conv3(h)))  # N,64,h,w
