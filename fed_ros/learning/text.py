"""Deterministic built-in instruction encoder (offline, no downloads).

An instruction is mapped to hashed features (word unigrams, word bigrams, character
trigrams); every feature owns a fixed pseudo-random Gaussian direction drawn from a seed
derived from a stable hash of the feature string. The weighted sum is L2-normalised. This
is a fixed random projection of an (unbounded) bag-of-n-grams vector: identical on every
robot and in every process (no use of Python's salted ``hash``), and instructions that share
words land close together.
"""

from __future__ import annotations

import hashlib
import re
from functools import lru_cache

import numpy as np

DEFAULT_TEXT_DIM = 256
TEXT_SEED = 20240917  # fleet-wide constant: changing it changes every embedding

_WORD = re.compile(r"[a-z0-9]+")
# Weights per feature family: whole words carry the meaning, char trigrams add robustness
# to inflections ("cube"/"cubes") and typos.
_WEIGHTS = {"w": 1.0, "b": 0.5, "c": 0.25}


def _direction(feature: str, dim: int) -> np.ndarray:
    digest = hashlib.blake2b(f"{TEXT_SEED}:{feature}".encode(), digest_size=8).digest()
    rng = np.random.default_rng(int.from_bytes(digest, "little"))
    return rng.standard_normal(dim).astype(np.float64)


def _features(text: str) -> list[tuple[str, float]]:
    words = _WORD.findall(text.lower())
    feats: list[tuple[str, float]] = [(f"w:{w}", _WEIGHTS["w"]) for w in words]
    feats += [(f"b:{a}_{b}", _WEIGHTS["b"]) for a, b in zip(words, words[1:])]
    for w in words:
        padded = f"<{w}>"
        trigrams = [padded[i : i + 3] for i in range(len(padded) - 2)]
        # Normalise per word so long words do not dominate.
        feats += [(f"c:{g}", _WEIGHTS["c"] / len(trigrams)) for g in trigrams]
    return feats


@lru_cache(maxsize=4096)
def _encode_cached(text: str, dim: int) -> bytes:
    vec = np.zeros(dim, dtype=np.float64)
    for feature, weight in _features(text):
        vec += weight * _direction(feature, dim)
    norm = np.linalg.norm(vec)
    if norm > 0:
        vec /= norm
    return vec.astype(np.float32).tobytes()


def encode_instruction(text: str, dim: int = DEFAULT_TEXT_DIM) -> np.ndarray:
    """Embed an instruction as a unit-norm float32 vector of length ``dim`` (zeros if empty)."""
    if not isinstance(text, str):
        raise ValueError(f"instruction must be a str, got {type(text).__name__}")
    if not isinstance(dim, int) or dim < 1:
        raise ValueError(f"dim must be a positive int, got {dim!r}")
    return np.frombuffer(_encode_cached(text, dim), dtype=np.float32).copy()


def encode_instructions(texts: list[str], dim: int = DEFAULT_TEXT_DIM) -> np.ndarray:
    """Embed several instructions: (len(texts), dim) float32."""
    if not texts:
        return np.zeros((0, dim), dtype=np.float32)
    return np.stack([encode_instruction(t, dim) for t in texts])
