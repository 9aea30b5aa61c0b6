"""Demonstration dataset: observation windows over recorded episodes, kept decoded in memory.

Every observation key is concatenated once into one contiguous array (images stay uint8),
so an epoch is pure fancy indexing: nothing is re-decoded. A sample is the window of the
``cfg.window`` frames ending at a frame; at an episode's start the window is padded by
repeating the first frame (``valid`` marks padded steps False). Failed episodes
(``success=False``) are excluded.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np
import torch

from fed_ros.core.arm.interventions import INTERVENTION_SOURCE
from fed_ros.core.data import episode as ep
from fed_ros.core.data.episode import Episode
from fed_ros.learning.configuration_policy import PolicyConfig
from fed_ros.learning.modeling_policy import LOWDIM_SPECS
from fed_ros.learning.text import encode_instruction

Stats = dict[str, tuple[np.ndarray, np.ndarray]]


def required_keys(cfg: PolicyConfig) -> tuple[str, ...]:
    """Observation keys a policy variant consumes."""
    if cfg.kind == "image":
        extra = (ep.OBJECT_STATE,) if cfg.use_object_state else ()
        extra += (ep.EEF_POS, ep.EEF_QUAT) if cfg.use_eef_state else ()
        return ep.IMAGE_KEYS + (ep.JOINT_POS, ep.GRIPPER_QPOS) + extra
    return (ep.JOINT_POS, ep.GRIPPER_QPOS, ep.EEF_POS, ep.EEF_QUAT, ep.OBJECT_STATE)


def split_episodes(
    episodes: Sequence[Episode], val_fraction: float = 0.1, seed: int = 0
) -> tuple[list[Episode], list[Episode]]:
    """Split by episode (never inside one): (train, val); val gets >= 1 episode if possible.

    Training keeps at least one taught demonstration (any source but a corrective
    ``intervention`` segment) when there is one: a segment alone is a fragment of the task.
    """
    if not 0.0 <= val_fraction < 1.0:
        raise ValueError(f"val_fraction must be in [0, 1), got {val_fraction!r}")
    order = np.random.default_rng(seed).permutation(len(episodes)).tolist()
    n_val = int(round(val_fraction * len(episodes)))
    if val_fraction > 0 and n_val == 0 and len(episodes) >= 2:
        n_val = 1
    val_order, train_order = order[:n_val], order[n_val:]
    taught = [
        episodes[i].metadata.get("source") != INTERVENTION_SOURCE for i in range(len(episodes))
    ]
    if not any(taught[i] for i in train_order):
        held_taught = [i for i in val_order if taught[i]]
        # Swap it with a training segment: the held-out count stays the same.
        if held_taught and train_order:
            val_order[val_order.index(held_taught[0])] = train_order[0]
            train_order[0] = held_taught[0]
    val_idx = set(val_order)
    train = [e for i, e in enumerate(episodes) if i not in val_idx]
    val = [e for i, e in enumerate(episodes) if i in val_idx]
    return train, val


def compute_stats(episodes: Sequence[Episode]) -> tuple[Stats, int]:
    """Per-key mean/std of the low-dim observations (successful episodes) and the frame count."""
    stats: Stats = {}
    kept = [e for e in episodes if e.success]
    count = sum(len(e) for e in kept)
    for key in LOWDIM_SPECS:
        if not kept or any(key not in e.observations for e in kept):
            continue
        x = np.concatenate([np.asarray(e.observations[key], np.float64) for e in kept])
        stats[key] = (x.mean(0).astype(np.float32), x.std(0).astype(np.float32))
    return stats, count


def merge_stats(parts: Sequence[tuple[Stats, int]], min_std: float = 1e-3) -> Stats:
    """Count-weighted merge of per-dataset (stats, count); std floored at ``min_std``."""
    merged: Stats = {}
    keys = set().union(*(p[0].keys() for p in parts)) if parts else set()
    for key in sorted(keys):
        rows = [
            (s[key][0].astype(np.float64), s[key][1].astype(np.float64), n)
            for s, n in parts
            if key in s and n > 0
        ]
        total = sum(n for _, _, n in rows)
        if total == 0:
            continue
        mean = sum(n * m for m, _, n in rows) / total
        # Law of total variance: within-dataset variance + spread of the dataset means.
        var = sum(n * (sd**2 + (m - mean) ** 2) for m, sd, n in rows) / total
        merged[key] = (
            mean.astype(np.float32),
            np.maximum(np.sqrt(var), min_std).astype(np.float32),
        )
    return merged


class DemoDataset:
    """Windows of ``cfg.window`` steps over successful episodes, indexable in batches."""

    def __init__(
        self, episodes: Sequence[Episode], cfg: PolicyConfig, stats: Stats | None = None
    ) -> None:
        self.cfg = cfg
        kept = [e for e in episodes if e.success]
        if not kept:
            raise ValueError(f"no successful episodes among {len(episodes)} given")
        keys = required_keys(cfg)
        for i, e in enumerate(kept):
            for key in keys:
                if key not in e.observations:
                    raise ValueError(
                        f"episode {i} ({e.task!r}) lacks observation {key!r} "
                        f"needed by a {cfg.kind!r} policy"
                    )
            if cfg.kind == "image":
                for key in ep.IMAGE_KEYS:
                    shape = np.shape(e.observations[key])[1:]
                    if shape != (cfg.image_size, cfg.image_size, 3):
                        raise ValueError(
                            f"episode {i} {key!r} frames are {shape}, expected "
                            f"({cfg.image_size}, {cfg.image_size}, 3) (image_size={cfg.image_size})"
                        )
        # No reference to the episodes is kept: once built, the caller may free them and
        # only the concatenated arrays stay in memory.
        self.instructions = [e.instruction for e in kept]
        self.lengths = np.array([len(e) for e in kept], dtype=np.int64)
        starts = np.concatenate([[0], np.cumsum(self.lengths)[:-1]])
        self.obs: dict[str, np.ndarray] = {}
        for key in keys:
            dtype = np.uint8 if key in ep.IMAGE_KEYS else np.float32
            self.obs[key] = np.concatenate([np.asarray(e.observations[key], dtype) for e in kept])
        self.actions = np.concatenate([e.actions for e in kept]).astype(np.float32)
        self.text = np.stack([encode_instruction(e.instruction, cfg.text_dim) for e in kept])
        self.frame_episode = np.repeat(np.arange(len(kept)), self.lengths)
        frame = np.arange(len(self.actions))
        ep_start = starts[self.frame_episode]
        offsets = np.arange(-cfg.window + 1, 1)  # window ends at the frame itself
        raw = frame[:, None] + offsets[None, :]
        self.window_index = np.maximum(raw, ep_start[:, None])  # pad by repeating frame 0
        self.window_valid = raw >= ep_start[:, None]
        self.stats = stats if stats is not None else compute_stats(kept)[0]

    def __len__(self) -> int:
        return len(self.actions)

    @property
    def num_episodes(self) -> int:
        """Number of (successful) episodes."""
        return len(self.lengths)

    def batch(self, indices: np.ndarray | Sequence[int]) -> dict[str, np.ndarray]:
        """Numpy batch of windows ending at the given frames (layout of ``modeling_policy``;
        images as a pool of distinct frames with ``image_index``)."""
        idx = np.asarray(indices, dtype=np.int64)
        if idx.ndim != 1 or (len(idx) and (idx.min() < 0 or idx.max() >= len(self))):
            raise ValueError(f"indices must be 1-D in [0, {len(self)})")
        win = self.window_index[idx]  # B,T
        out: dict[str, np.ndarray] = {
            k: v[win] for k, v in self.obs.items() if k not in ep.IMAGE_KEYS
        }
        out["actions"] = self.actions[win]
        out["valid"] = self.window_valid[idx]
        out["text"] = self.text[self.frame_episode[idx]]
        if self.cfg.kind == "image":
            # Overlapping windows share frames: the images go out once per distinct frame
            # (U,H,W,3) with each step's position in that pool (B,T), so neither the copy
            # nor the encoder repeats a frame. image_episode (U,) lets the trainer shift
            # every frame of an episode alike.
            frames, inverse = np.unique(win, return_inverse=True)
            for key in ep.IMAGE_KEYS:
                out[key] = self.obs[key][frames]
            out["image_index"] = inverse.reshape(win.shape)
            out["image_episode"] = self.frame_episode[frames]
        return out

    def torch_batch(
        self, indices: np.ndarray | Sequence[int], device: torch.device | str = "cpu"
    ) -> dict[str, Any]:
        """The same batch as tensors on ``device`` (images stay uint8 until the model)."""
        dev = torch.device(device)
        nb = dev.type == "cuda"
        return {
            k: torch.from_numpy(v).to(dev, non_blocking=nb) for k, v in self.batch(indices).items()
        }


def synthetic_episodes(
    n: int,
    length: int = 40,
    kind: str = "lowdim",
    seed: int = 0,
    image_size: int = 84,
    shift: float = 0.0,
    task: str = "lift",
    instruction: str = "lift the red cube",
) -> list[Episode]:
    """Synthetic demonstrations with a learnable observation -> action map (tests, benches).

    The object drifts smoothly; the expert action moves the end effector towards it and
    closes the gripper when near. Images (``kind="image"``) draw the object as a bright
    square on a background whose brightness ``shift`` changes; low-dim observations are
    offset by ``shift`` (a covariate shift for descriptor tests).
    """
    if n < 1 or length < 1:
        raise ValueError(f"n and length must be >= 1, got {n}, {length}")
    if kind not in ("image", "lowdim"):
        raise ValueError(f"kind must be 'image' or 'lowdim', got {kind!r}")
    rng = np.random.default_rng(seed)
    episodes = []
    for _ in range(n):
        obj = rng.uniform(-0.3, 0.3, 3) + np.cumsum(rng.normal(0, 0.01, (length, 3)), 0)
        eef = rng.uniform(-0.3, 0.3, 3) + np.zeros((length, 3))
        actions = np.zeros((length, ep.ACTION_DIM), np.float32)
        for t in range(length):
            delta = obj[t] - eef[t]
            actions[t, :3] = np.clip(delta / 0.1, -1, 1)
            actions[t, 3] = 1.0 if np.linalg.norm(delta) < 0.05 else -1.0
            if t + 1 < length:
                eef[t + 1] = eef[t] + 0.02 * actions[t, :3]
        object_state = np.zeros((length, ep.OBJECT_STATE_DIM), np.float32)
        object_state[:, :3] = obj
        object_state[:, 3:6] = obj - eef
        grip = np.where(actions[:, 3:4] > 0, 0.0, 0.04) * np.ones((1, 2))
        obs = {
            ep.JOINT_POS: (
                np.tile(rng.normal(0, 0.5, 7), (length, 1))
                + 0.5 * np.concatenate([eef, eef, eef[:, :1]], 1)
            ),
            ep.GRIPPER_QPOS: grip,
            ep.EEF_POS: eef,
            ep.EEF_QUAT: np.tile([0.0, 1.0, 0.0, 0.0], (length, 1)),
            ep.OBJECT_STATE: object_state,
        }
        obs = {k: (np.asarray(v) + shift).astype(np.float32) for k, v in obs.items()}
        if kind == "image":
            base = int(np.clip(40 + 150 * shift, 0, 200))
            for key, source in ((ep.AGENTVIEW_IMAGE, obj), (ep.WRIST_IMAGE, obj - eef)):
                imgs = np.full((length, image_size, image_size, 3), base, np.uint8)
                imgs += rng.integers(0, 20, imgs.shape, dtype=np.uint8)  # sensor noise
                side = max(2, image_size // 8)
                for t in range(length):
                    cy, cx = (
                        (np.clip(source[t, :2], -0.5, 0.5) + 0.5) * (image_size - side)
                    ).astype(int)
                    imgs[t, cy : cy + side, cx : cx + side] = (230, 40, 40)
                obs[key] = imgs
        episodes.append(
            Episode(task=task, instruction=instruction, observations=obs, actions=actions)
        )
    return episodes
