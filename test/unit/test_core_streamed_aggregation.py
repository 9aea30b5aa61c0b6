"""The streamed path (each update read in place, block by block) gives the stacked path's bits.

The stacked path (``stack_updates=True``: the round's K updates copied into one (K, P) array)
is the reference; every strategy and robust rule runs both over the same rounds and the
cluster models, assignments and FedDRMan's similarity matrix must be equal to the bit.
Column blocks are made small here so that every tensor spans several of them.
"""

from __future__ import annotations

import numpy as np
import pytest

from fed_ros.core.params import flatten, manifest_of, num_params, unflatten
from fed_ros.core.strategies import streamed
from fed_ros.core.strategies.aggregate import weighted_rows
from fed_ros.core.strategies.base import make_strategy
from fed_ros.core.strategies.robust import aggregate_robust
from fed_ros.core.strategies.types import ClientDescriptor, ClientUpdate

ROBOTS = [f"robot_{k}" for k in range(9)]
INIT = {
    "encoder.w": np.linspace(-1, 1, 37 * 11, dtype=np.float32).reshape(37, 11),
    "temporal.w": np.linspace(0.5, -0.5, 23 * 19, dtype=np.float32).reshape(23, 19),
    "temporal.b": np.zeros(19, np.float32),
    "head.w": np.linspace(-0.3, 0.7, 13 * 17, dtype=np.float32).reshape(13, 17),
}
MANIFEST = manifest_of(INIT)
STRATEGIES = {
    "fedavg": {},
    "fedprox": {"mu": 0.01},
    "ifca": {"num_clusters": 3},
    "feddrman": {"num_clusters": 3, "beta": 0.9},
    "fedepth": {"target_overlap": 0.2},
    "rnd": {"eps": 1.0},
    "local": {},
}
RULES = {
    "mean": {},
    "median": {},
    "trimmed_mean": {"trim": 0.2},
    "clip": {},
    "multi_krum": {"f": 0, "m": 2},  # clusters of 3 robots: n >= 2f + 3 needs f = 0
}


@pytest.fixture(autouse=True)
def small_blocks(monkeypatch):
    """Blocks of 64 floats: the tensors (407, 437, 19, 221 floats) span several, unaligned."""
    monkeypatch.setattr(streamed, "BLOCK", 64)
    monkeypatch.setattr(streamed, "SUM_BLOCK", 64)
    monkeypatch.setattr(streamed, "similarity_chunk", lambda K: 64)
    monkeypatch.setattr("fed_ros.core.strategies.aggregate.similarity_chunk", lambda K, c=0: 64)
    monkeypatch.setattr("fed_ros.core.strategies.robust.KRUM_BLOCK", 64)
    monkeypatch.setattr("fed_ros.core.strategies.aggregate._ROW_BLOCK", 64)


def _round_inputs(round_idx: int) -> tuple[list[ClientUpdate], dict[str, ClientDescriptor]]:
    """Three families of robots, noise, uneven sample counts, in a shuffled arrival order."""
    rng = np.random.default_rng(round_idx)
    theta0 = flatten(INIT)
    family_dirs = rng.standard_normal((3, theta0.size)).astype(np.float32) * 0.05
    updates, descriptors = [], {}
    for k, rid in enumerate(ROBOTS):
        fam = k % 3
        noise = rng.standard_normal(theta0.size).astype(np.float32) * 0.01
        sd = unflatten(theta0 + family_dirs[fam] + noise, MANIFEST, copy=True)
        updates.append(ClientUpdate(rid, sd, 10 + 7 * k, round_idx, cluster_id=fam))
        descriptors[rid] = ClientDescriptor(
            rid,
            "gaussian",
            mean=3.0 * fam + 0.1 * rng.standard_normal(8),
            variance=rng.uniform(0.9, 1.1, 8),
            num_samples=10,
        )
    order = rng.permutation(len(updates))
    return [updates[i] for i in order], descriptors


def _rnd_descriptors() -> dict[str, ClientDescriptor]:
    fam = {rid: k % 3 for k, rid in enumerate(ROBOTS)}
    return {
        r: ClientDescriptor(
            r,
            "rnd",
            scores={p: (0.1 if fam[p] == fam[r] else 5.0) for p in ROBOTS},
            residual_std=0.1,
        )
        for r in ROBOTS
    }


def _run(name: str, rule: str, stack: bool, rounds: int = 3) -> list:
    kw = dict(STRATEGIES[name])
    if rule != "mean":
        kw.update(robust=rule, robust_kwargs=RULES[rule])
    s = make_strategy(name, stack_updates=stack, **kw)
    s.initialize(INIT, ROBOTS)
    out = []
    for r in range(rounds):
        updates, desc = _round_inputs(r)
        if name == "rnd":
            desc = _rnd_descriptors()
        res = s.aggregate_round(r, updates, desc)
        out.append(
            (
                {c: flatten(m) for c, m in res.cluster_models.items()},
                res.assignments,
                res.diagnostics.get("similarity"),
            )
        )
    return out


@pytest.mark.parametrize("rule", sorted(RULES))
@pytest.mark.parametrize("name", sorted(STRATEGIES))
def test_streamed_round_equals_stacked_round_to_the_bit(name, rule):
    stacked = _run(name, rule, stack=True)
    streamed_ = _run(name, rule, stack=False)
    for (m_a, as_a, s_a), (m_b, as_b, s_b) in zip(stacked, streamed_):
        assert sorted(m_a) == sorted(m_b)
        for c in m_a:
            assert np.array_equal(m_a[c], m_b[c]), (name, rule, c)
        assert as_a == as_b
        assert s_a == s_b


def _oracle_weighted_rows(stacked: np.ndarray, W: np.ndarray) -> np.ndarray:
    """Whole-row float32 sums in row order, written out independently of the library."""
    out = np.zeros((W.shape[0], stacked.shape[1]), np.float32)
    for g in range(W.shape[0]):
        ks = [k for k in range(stacked.shape[0]) if W[g, k] != 0]
        acc = W[g, ks[0]] * stacked[ks[0]]
        for k in ks[1:]:
            acc = acc + W[g, k] * stacked[k]
        out[g] = acc
    return out


def test_weighted_sums_add_rows_in_order_like_the_whole_row_oracle():
    rng = np.random.default_rng(3)
    stacked = rng.standard_normal((7, num_params(MANIFEST))).astype(np.float32)
    W = rng.random((3, 7)).astype(np.float32)
    W[1, 2] = 0.0
    sds = [unflatten(row, MANIFEST) for row in stacked]
    want = _oracle_weighted_rows(stacked, W)
    assert np.array_equal(weighted_rows(stacked, W), want)
    assert np.array_equal(streamed.weighted_sums(sds, W, MANIFEST), want)


@pytest.mark.parametrize("rule", sorted(RULES))
def test_robust_average_read_in_place_equals_whole_array_rule(rule):
    rng = np.random.default_rng(5)
    stacked = rng.standard_normal((9, num_params(MANIFEST))).astype(np.float32)
    w = rng.random(9)
    kw = dict(RULES[rule])
    if rule == "clip":
        kw["reference"] = stacked.mean(axis=0)
    sds = [unflatten(row, MANIFEST) for row in stacked]
    want = aggregate_robust(stacked, w, rule, **kw)
    assert np.array_equal(streamed.robust_average(sds, w, MANIFEST, rule, **kw), want)
