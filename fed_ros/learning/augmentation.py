"""Image augmentation of policy training batches (torch): random shifts of uint8 camera windows."""

from __future__ import annotations

import torch


def random_shift(
    images: torch.Tensor,
    pad: int,
    generator: torch.Generator | None = None,
    groups: torch.Tensor | None = None,
) -> torch.Tensor:
    """Random-shift augmentation of uint8 windows (B,T,H,W,3): replicate-pad by ``pad`` and
    crop back at one random offset per sequence (the same shift for all T frames, so motion
    between frames is preserved). Applied by the trainer once per batch, so the teacher and
    the student see identical inputs.

    ``groups`` (B,) ints: sequences with equal group share one shift. The trainer passes
    each window's episode, so a frame that appears in several windows of a batch is
    shifted identically everywhere and the policy can encode it once (``image_index``).
    Pad-and-crop is done as integer slice copies of the uint8 pixels plus edge
    replication: no float copy, no padded intermediate (measured on 1 thread: 4-8 ms per
    camera at B=32, T=5, 84 px, against 46 ms for a clamped-index gather).
    """
    if pad <= 0:
        return images
    b, t, h, w, c = images.shape
    gen_dev = generator.device if generator is not None else "cpu"
    if groups is None:
        group_of = list(range(b))
        n_groups = b
    else:
        uniq, inverse = torch.unique(torch.as_tensor(groups).reshape(-1), return_inverse=True)
        if inverse.shape[0] != b:
            raise ValueError(
                f"groups must have one entry per sequence ({b}), "
                f"got {tuple(torch.as_tensor(groups).shape)}"
            )
        group_of, n_groups = inverse.tolist(), len(uniq)
    offs = torch.randint(
        0, 2 * pad + 1, (n_groups, 2), generator=generator, device=gen_dev
    ).tolist()
    out = torch.empty_like(images)
    i = 0
    while i < b:  # runs of consecutive sequences with one group are shifted in one go
        j = i + 1
        while j < b and group_of[j] == group_of[i]:
            j += 1
        dy, dx = (o - pad for o in offs[group_of[i]])  # out[y, x] = in[clamp(y+dy), clamp(x+dx)]
        src, dst = images[i:j], out[i:j]  # n,T,H,W,3
        y0, y1 = max(-dy, 0), h - max(dy, 0)  # rows and columns with a source pixel
        x0, x1 = max(-dx, 0), w - max(dx, 0)
        dst[:, :, y0:y1, x0:x1] = src[:, :, y0 + dy : y1 + dy, x0 + dx : x1 + dx]
        # Replicate padding: the border rows/columns repeat the nearest copied one.
        if x0:
            dst[:, :, y0:y1, :x0] = dst[:, :, y0:y1, x0 : x0 + 1]
        if x1 < w:
            dst[:, :, y0:y1, x1:] = dst[:, :, y0:y1, x1 - 1 : x1]
        if y0:
            dst[:, :, :y0] = dst[:, :, y0 : y0 + 1]
        if y1 < h:
            dst[:, :, y1:] = dst[:, :, y1 - 1 : y1]
        i = j
    return out
