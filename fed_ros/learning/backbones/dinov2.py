"""DINOv2 ViT-S/14 with the official torch.hub ``dinov2_vits14`` module names.

Layout (Oquab et al. 2023; facebookresearch/dinov2 ``vit_small``, patch 14, as the hub
builds it: 518 px pretraining grid, layer scale, MLP FFN, no register tokens, unchunked
``blocks``): a 14x14/14 patch conv ``patch_embed.proj``, a ``cls_token``, learned
``pos_embed`` for the 37x37 grid, twelve pre-norm blocks (``norm1``, ``attn.qkv``,
``attn.proj``, ``ls1.gamma``, ``norm2``, ``mlp.fc1``, ``mlp.fc2``, ``ls2.gamma``; 6 heads,
GELU, LayerNorm eps 1e-6), a final ``norm`` and the masked-modelling ``mask_token``.
22,056,576 parameters. ``forward`` returns the normalised patch tokens as a feature map.
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

EMBED_DIM = 384
DEPTH = 12
HEADS = 6
PATCH = 14
PRETRAIN_GRID = 37  # 518 px / 14
# The official interpolation scales by (grid + 0.1) / 37 rather than by the size ratio, to
# avoid a floating-point off-by-one in the output size (facebookresearch/dino issue 8);
# the same factor reproduces its positional embeddings exactly.
_INTERPOLATE_OFFSET = 0.1


class Attention(nn.Module):
    """Multi-head self-attention with one fused ``qkv`` projection."""

    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, n, d = x.shape
        qkv = self.qkv(x).reshape(b, n, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        out = F.scaled_dot_product_attention(qkv[0], qkv[1], qkv[2])  # B,heads,N,d/heads
        return self.proj(out.transpose(1, 2).reshape(b, n, d))


class LayerScale(nn.Module):
    """Per-channel residual branch scale ``gamma``."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.gamma = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.gamma


class Mlp(nn.Module):
    """Two-layer GELU feed-forward network (``fc1``, ``fc2``)."""

    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden)
        self.fc2 = nn.Linear(hidden, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.gelu(self.fc1(x)))


class Block(nn.Module):
    """Pre-norm transformer block with layer-scaled residual branches."""

    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(dim, eps=1e-6)
        self.attn = Attention(dim, heads)
        self.ls1 = LayerScale(dim)
        self.norm2 = nn.LayerNorm(dim, eps=1e-6)
        self.mlp = Mlp(dim, 4 * dim)
        self.ls2 = LayerScale(dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.ls1(self.attn(self.norm1(x)))
        return x + self.ls2(self.mlp(self.norm2(x)))


class PatchEmbed(nn.Module):
    """Non-overlapping patch projection (``proj``)."""

    def __init__(self, dim: int, patch: int) -> None:
        super().__init__()
        self.proj = nn.Conv2d(3, dim, patch, patch)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(x)  # N,D,H/patch,W/patch


class DinoV2ViTS14(nn.Module):
    """DINOv2 ViT-S/14; ``forward`` maps ImageNet-normalised images (N, 3, H, W), sides
    multiples of 14, to the final-norm patch tokens as a map (N, 384, H/14, W/14)."""

    out_channels = EMBED_DIM

    def __init__(self) -> None:
        super().__init__()
        self.patch_embed = PatchEmbed(EMBED_DIM, PATCH)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, EMBED_DIM))
        self.pos_embed = nn.Parameter(torch.zeros(1, 1 + PRETRAIN_GRID**2, EMBED_DIM))
        self.blocks = nn.ModuleList(Block(EMBED_DIM, HEADS) for _ in range(DEPTH))
        self.norm = nn.LayerNorm(EMBED_DIM, eps=1e-6)
        self.mask_token: nn.Parameter | None = nn.Parameter(torch.zeros(1, EMBED_DIM))

    def drop_unused(self) -> None:
        """Remove ``mask_token`` (used only by masked pretraining), so a fine-tuned trunk
        federates only what trains."""
        self.mask_token = None

    def position_embedding(self, rows: int, cols: int) -> torch.Tensor:
        """Positional embeddings (1, 1 + rows*cols, 384) for a rows x cols patch grid: the
        pretrained 37x37 grid bicubically resized as the official model does."""
        if rows == cols == PRETRAIN_GRID:
            return self.pos_embed
        cls_pos = self.pos_embed[:, :1]
        grid = self.pos_embed[:, 1:].float().reshape(1, PRETRAIN_GRID, PRETRAIN_GRID, -1)
        scale = (
            (rows + _INTERPOLATE_OFFSET) / PRETRAIN_GRID,
            (cols + _INTERPOLATE_OFFSET) / PRETRAIN_GRID,
        )
        grid = F.interpolate(grid.permute(0, 3, 1, 2), scale_factor=scale, mode="bicubic")
        if grid.shape[-2:] != (rows, cols):
            raise ValueError(f"interpolated a {tuple(grid.shape[-2:])} grid, wanted {rows}x{cols}")
        grid = grid.permute(0, 2, 3, 1).reshape(1, rows * cols, -1).to(self.pos_embed.dtype)
        return torch.cat([cls_pos, grid], dim=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[-2] % PATCH or x.shape[-1] % PATCH:
            raise ValueError(f"input sides must be multiples of {PATCH}, got {tuple(x.shape)}")
        patches = self.patch_embed(x)  # N,D,h,w
        n, d, rows, cols = patches.shape
        tokens = torch.cat([self.cls_token.expand(n, -1, -1), patches.flatten(2).mT], dim=1)
        tokens = tokens + self.position_embedding(rows, cols)
        for block in self.blocks:
            tokens = block(tokens)
        patch_tokens = self.norm(tokens)[:, 1:]  # N,h*w,D
        return patch_tokens.mT.reshape(n, d, rows, cols)
