"""What each supported pretrained backbone needs: its published weights file and input size.

Torch-free, so ``PolicyConfig`` validates backbone settings without importing the models.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class BackboneSpec:
    """A published backbone: where its weights come from and how its input is shaped.

    Attributes:
        name: the ``PolicyConfig.vision_backbone`` value.
        file_name: the weights file's name as torch.hub saves it under
            ``<torch.hub.get_dir()>/checkpoints/``.
        url: where the file is published (downloaded by hand, never at run time); empty
            for the fleet's own encoder, whose file the fleet encoder stage writes.
        out_channels: channels of the feature map the policy's adapter reads.
        patch: the input side must be a multiple of this (the ViT patch size; 1 for a convnet).
        min_size: the smallest input side that still yields a feature map.
    """

    name: str
    file_name: str
    url: str
    out_channels: int
    patch: int
    min_size: int

    def default_input_size(self, image_size: int) -> int:
        """Input side for camera frames of ``image_size``: the nearest allowed multiple."""
        return max(self.min_size, self.patch * round(image_size / self.patch))


SCRATCH = "scratch"
FLEET = "fleet"

BACKBONE_SPECS: dict[str, BackboneSpec] = {
    # torchvision's ResNet18_Weights.IMAGENET1K_V1.
    "resnet18_imagenet": BackboneSpec(
        name="resnet18_imagenet",
        file_name="resnet18-f37072fd.pth",
        url="https://download.pytorch.org/models/resnet18-f37072fd.pth",
        out_channels=512,
        patch=1,
        # Five stride-2 stages: 32 px is the smallest input with a full 1x1 final map.
        min_size=32,
    ),
    # torch.hub's facebookresearch/dinov2 ``dinov2_vits14`` (ViT-S/14, LVD-142M, no registers).
    "dinov2_vits14": BackboneSpec(
        name="dinov2_vits14",
        file_name="dinov2_vits14_pretrain.pth",
        url="https://dl.fbaipublicfiles.com/dinov2/dinov2_vits14/dinov2_vits14_pretrain.pth",
        out_channels=384,
        patch=14,
        min_size=14,
    ),
    # The fleet's own encoder (backbones/fleet.py): no published file; the fleet encoder
    # stage writes it and ``backbone_weights`` must name it.
    FLEET: BackboneSpec(
        name=FLEET,
        file_name="fleet_encoder.safetensors",
        url="",
        out_channels=64,
        patch=1,
        # The 4x4/4 stem and the stride-2 conv: 8 px is the smallest input with a 1x1 map.
        min_size=8,
    ),
}

VISION_BACKBONES = (SCRATCH, *BACKBONE_SPECS)
