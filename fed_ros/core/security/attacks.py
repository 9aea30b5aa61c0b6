"""Attack harness: what a malicious robot sends, for tests and `fed-ros bench robustness`.

Model attacks act on a robot's *update* relative to the model it started from
(delta = update - reference), the way a Byzantine client would: flip the delta's sign, scale it,
bury it in Gaussian noise or inject NaN. Data attacks corrupt a robot's demonstrations before
training (label flipping for continuous actions = negating or shuffling the commanded actions).
All functions return new objects; inputs are never modified.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from numpy.typing import NDArray

from fed_ros.core.data.episode import Episode
from fed_ros.core.strategies.types import ClientUpdate

StateDict = dict[str, NDArray[Any]]

MODEL_ATTACKS = ("none", "sign_flip", "scale10", "scale100", "gaussian", "nan")
DATA_ATTACKS = ("label_flip_negate", "label_flip_shuffle")
ATTACKS = MODEL_ATTACKS + DATA_ATTACKS


def attack_vector(
    update: NDArray[Any],
    reference: NDArray[Any],
    attack: str,
    *,
    seed: int = 0,
    noise_std: float | None = None,
    nan_fraction: float = 0.01,
) -> NDArray[Any]:
    """Apply a model attack to a flat float32 update given the reference it started from.

    sign_flip: reference - delta; scaleN: reference + N * delta; gaussian: reference + N(0, s^2)
    with s = noise_std or, by default, 10x the delta's per-coordinate RMS (a large random update);
    nan: a fraction of coordinates set to NaN (at least one).
    """
    update = np.asarray(update, dtype=np.float32)
    reference = np.asarray(reference, dtype=np.float32)
    if update.shape != reference.shape:
        raise ValueError(f"update shape {update.shape} != reference shape {reference.shape}")
    if attack not in MODEL_ATTACKS:
        raise ValueError(f"unknown model attack {attack!r}; choose from {MODEL_ATTACKS}")
    delta = update.astype(np.float64) - reference
    if attack == "none":
        out = update.astype(np.float64)
    elif attack == "sign_flip":
        out = reference - delta
    elif attack in ("scale10", "scale100"):
        out = reference + (10.0 if attack == "scale10" else 100.0) * delta
    elif attack == "gaussian":
        rms = float(np.sqrt(np.mean(delta**2))) if delta.size else 0.0
        std = 10.0 * max(rms, 1e-3) if noise_std is None else float(noise_std)
        if not np.isfinite(std) or std < 0:
            raise ValueError(f"noise_std must be finite and >= 0, got {noise_std!r}")
        out = reference + np.random.default_rng(seed).normal(0.0, std, size=update.shape)
    else:  # nan
        if not 0.0 < nan_fraction <= 1.0:
            raise ValueError(f"nan_fraction must be in (0, 1], got {nan_fraction!r}")
        out = update.astype(np.float64).copy()
        flat = out.reshape(-1)
        if flat.size:
            k = max(1, int(round(nan_fraction * flat.size)))
            flat[np.random.default_rng(seed).choice(flat.size, size=k, replace=False)] = np.nan
    return out.astype(np.float32)


def attack_state_dict(
    update: Mapping[str, NDArray[Any]],
    reference: Mapping[str, NDArray[Any]],
    attack: str,
    **kw: Any,
) -> StateDict:
    """`attack_vector` applied to a whole state dict (same names, shapes, float32)."""
    if list(update) != list(reference):
        raise ValueError(
            f"update and reference have different tensors: "
            f"{sorted(set(update) ^ set(reference))[:5]}"
        )
    names = list(update)
    for name in names:
        if np.shape(update[name]) != np.shape(reference[name]):
            raise ValueError(
                f"tensor {name!r}: update shape {np.shape(update[name])} != "
                f"reference shape {np.shape(reference[name])}"
            )
    flat_u = (
        np.concatenate([np.asarray(update[n], np.float32).ravel() for n in names])
        if names
        else np.zeros(0, np.float32)
    )
    flat_r = (
        np.concatenate([np.asarray(reference[n], np.float32).ravel() for n in names])
        if names
        else np.zeros(0, np.float32)
    )
    flat = attack_vector(flat_u, flat_r, attack, **kw)
    out: StateDict = {}
    pos = 0
    for name in names:
        shape = np.shape(update[name])
        size = int(np.prod(shape, dtype=np.int64))
        out[name] = flat[pos : pos + size].reshape(shape).copy()
        pos += size
    return out


def attack_update(
    update: ClientUpdate, reference: Mapping[str, NDArray[Any]], attack: str, **kw: Any
) -> ClientUpdate:
    """A copy of a core ClientUpdate whose params carry the attack (sample count unchanged)."""
    return dataclasses.replace(
        update, params=attack_state_dict(update.params, reference, attack, **kw)
    )


def label_flip(episodes: Sequence[Episode], mode: str = "negate", seed: int = 0) -> list[Episode]:
    """Corrupt demonstrations' actions: "negate" (every delta and the gripper inverted) or
    "shuffle" (actions permuted across all time steps of all episodes, breaking obs->action)."""
    if mode not in ("negate", "shuffle"):
        raise ValueError(f"label_flip mode must be 'negate' or 'shuffle', got {mode!r}")
    episodes = list(episodes)
    if mode == "negate":
        new_actions = [-np.asarray(ep.actions, np.float32) for ep in episodes]
    else:
        lengths = [len(ep) for ep in episodes]
        pool = (
            np.concatenate([np.asarray(ep.actions, np.float32) for ep in episodes])
            if episodes
            else np.zeros((0, 4), np.float32)
        )
        pool = pool[np.random.default_rng(seed).permutation(len(pool))]
        new_actions = np.split(pool, np.cumsum(lengths)[:-1]) if episodes else []
    out = []
    for ep, actions in zip(episodes, new_actions):
        meta = dict(ep.metadata)
        meta["attack"] = f"label_flip_{mode}"
        out.append(dataclasses.replace(ep, actions=np.ascontiguousarray(actions), metadata=meta))
    return out
