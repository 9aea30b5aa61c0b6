"""Params, FedAvg arithmetic, Jeffreys, cosine similarity and robust rules."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fed_ros.core.strategies.aggregate import (
    cosine_similarity_matrix,
    fedavg,
    jeffreys_diag,
    jeffreys_matrix,
    sample_weights,
    weighted_average,
)
from fed_ros.core.params import (
    UpdateBuffer,
    check_finite,
    check_manifest,
    flatten,
    manifest_of,
    prefix_columns,
    select_prefix,
    stack_state_dicts,
    unflatten,
)
from fed_ros.core.strategies.robust import aggregate_robust, krum_scores, multi_krum, norm_clip_mean


def _sd(seed: int = 0, scale: float = 1.0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {
        "temporal.w": (scale * rng.normal(size=(3, 4))).astype(np.float32),
        "temporal.b": (scale * rng.normal(size=4)).astype(np.float32),
        "head.w": (scale * rng.normal(size=(2, 3))).astype(np.float32),
    }


def test_flatten_unflatten_roundtrip_and_views():
    sd = _sd()
    man = manifest_of(sd)
    vec = flatten(sd)
    assert vec.dtype == np.float32 and vec.shape == (12 + 4 + 6,)
    back = unflatten(vec, man)
    for k in sd:
        np.testing.assert_array_equal(back[k], sd[k])
    back["head.w"][0, 0] = 42.0
    assert vec[16] == 42.0  # views, not copies


def test_check_manifest_names_the_bad_tensor():
    sd = _sd()
    man = manifest_of(sd)
    bad = dict(sd)
    bad["head.w"] = np.zeros((3, 2), np.float32)
    with pytest.raises(ValueError, match="head.w"):
        check_manifest(bad, man)
    missing = {k: v for k, v in sd.items() if k != "temporal.b"}
    with pytest.raises(ValueError, match="temporal.b"):
        check_manifest(missing, man)
    wrong_dtype = dict(sd)
    wrong_dtype["temporal.b"] = sd["temporal.b"].astype(np.float64)
    with pytest.raises(ValueError, match="temporal.b"):
        check_manifest(wrong_dtype, man)


def test_check_finite_names_tensor():
    sd = _sd()
    sd["temporal.b"][1] = np.nan
    with pytest.raises(ValueError, match="temporal.b"):
        check_finite(sd)


def test_select_prefix_and_columns():
    sd = _sd()
    man = manifest_of(sd)
    assert list(select_prefix(sd, ["temporal."])) == ["temporal.w", "temporal.b"]
    assert prefix_columns(man, ("temporal.",)) == slice(0, 16)
    assert prefix_columns(man, ("nope.",)).size == 0


def test_update_buffer_stacks_without_copy():
    sd = _sd()
    man = manifest_of(sd)
    buf = UpdateBuffer(man, 3)
    views = [buf.add(_sd(i)) for i in range(3)]
    stacked = stack_state_dicts(views, man)
    assert np.shares_memory(stacked, buf.data)
    np.testing.assert_array_equal(stacked[2], flatten(_sd(2)))
    copied = stack_state_dicts([_sd(i) for i in range(3)], man)
    np.testing.assert_array_equal(copied, stacked)


def test_fedavg_hand_computed():
    a = {"w": np.array([1.0, 2.0], np.float32)}
    b = {"w": np.array([3.0, 6.0], np.float32)}
    out = fedavg([a, b], [1, 3])
    np.testing.assert_allclose(out["w"], [2.5, 5.0])


def test_fedavg_rejects_bad_inputs():
    a, b = _sd(0), _sd(1)
    with pytest.raises(ValueError, match="-3"):
        fedavg([a, b], [1, -3])
    b["head.w"][0, 0] = np.inf
    with pytest.raises(ValueError, match="update 1"):
        fedavg([a, b], [1, 1])
    c = dict(_sd(2))
    c["extra"] = np.zeros(1, np.float32)
    with pytest.raises(ValueError, match="extra"):
        fedavg([a, c], [1, 1])
    with pytest.raises(ValueError):
        sample_weights([0, 0])


@settings(max_examples=25, deadline=None)
@given(k=st.integers(1, 6), seed=st.integers(0, 10_000))
def test_fedavg_of_identical_models_is_that_model(k, seed):
    sd = _sd(seed)
    rng = np.random.default_rng(seed)
    out = fedavg([sd] * k, rng.integers(1, 100, size=k).tolist())
    for name in sd:
        np.testing.assert_allclose(out[name], sd[name], rtol=1e-6, atol=1e-6)


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 10_000), k=st.integers(2, 7))
def test_fedavg_permutation_invariant(seed, k):
    rng = np.random.default_rng(seed)
    sds = [_sd(seed + i) for i in range(k)]
    n = rng.integers(1, 50, size=k).tolist()
    perm = rng.permutation(k)
    a = fedavg(sds, n)
    b = fedavg([sds[i] for i in perm], [n[i] for i in perm])
    for name in a:
        np.testing.assert_allclose(a[name], b[name], rtol=1e-5, atol=1e-6)


def test_jeffreys_of_two_known_gaussians():
    # N(0,1) vs N(1,2) in 1-D: KL(p||q) = 0.5(ln2 + (1+1)/2 - 1) = 0.5 ln 2,
    # KL(q||p) = 0.5(ln(1/2) + (2+1)/1 - 1) = 0.5(2 - ln 2); sum = 1.0 exactly.
    assert jeffreys_diag(
        np.array([0.0]), np.array([1.0]), np.array([1.0]), np.array([2.0])
    ) == pytest.approx(1.0)
    # Two dimensions add up; equal Gaussians have divergence 0.
    J = jeffreys_matrix(
        np.array([[0.0, 0.0], [1.0, 0.0], [0.0, 0.0]]), np.array([[1.0, 1.0], [2.0, 1.0], [1, 1]])
    )
    assert J[0, 1] == pytest.approx(1.0) and J[1, 0] == pytest.approx(1.0)
    assert J[0, 2] == pytest.approx(0.0) and np.allclose(np.diag(J), 0)


def test_jeffreys_matrix_large_path_matches_direct():
    rng = np.random.default_rng(3)
    m = rng.normal(size=(300, 250))
    v = rng.uniform(0.5, 2.0, size=(300, 250))
    J = jeffreys_matrix(m, v)  # takes the GEMM expansion (K*K*D > 2e7)
    for i, j in [(0, 1), (5, 200), (299, 3)]:
        assert J[i, j] == pytest.approx(jeffreys_diag(m[i], v[i], m[j], v[j]), rel=1e-9)
    with pytest.raises(ValueError, match="variance"):
        jeffreys_matrix(m[:2], np.zeros((2, 250)))


def test_cosine_similarity_zero_vector_rule():
    S = cosine_similarity_matrix(np.array([[1.0, 0.0], [0.0, 0.0], [1.0, 1.0]]))
    assert S[0, 2] == pytest.approx(1 / np.sqrt(2))
    assert S[0, 1] == 0.0 and S[1, 1] == 1.0


@settings(max_examples=20, deadline=None)
@given(
    seed=st.integers(0, 10_000),
    k=st.integers(5, 9),
    rule=st.sampled_from(["mean", "median", "trimmed_mean", "clip", "multi_krum"]),
)
def test_robust_rules_equal_fedavg_on_identical_honest_inputs(seed, k, rule):
    row = np.random.default_rng(seed).normal(size=50).astype(np.float32)
    stacked = np.repeat(row[None], k, axis=0)
    w = np.random.default_rng(seed + 1).uniform(1, 5, size=k)
    kw = (
        {"f": 1}
        if rule == "multi_krum"
        else ({"reference": np.zeros(50, np.float32)} if rule == "clip" else {})
    )
    out = aggregate_robust(stacked, w, rule, **kw)
    np.testing.assert_allclose(out, weighted_average(stacked, w / w.sum()), rtol=1e-5, atol=1e-6)


@settings(max_examples=15, deadline=None)
@given(seed=st.integers(0, 10_000), rule=st.sampled_from(["median", "trimmed_mean", "multi_krum"]))
def test_robust_rules_order_invariant(seed, rule):
    rng = np.random.default_rng(seed)
    stacked = rng.normal(size=(7, 20)).astype(np.float32)
    perm = rng.permutation(7)
    kw = {"f": 1} if rule == "multi_krum" else {}
    a = aggregate_robust(stacked, np.ones(7), rule, **kw)
    b = aggregate_robust(stacked[perm], np.ones(7), rule, **kw)
    np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-6)


def test_krum_refuses_too_few_clients():
    stacked = np.zeros((4, 3), np.float32)
    with pytest.raises(ValueError, match="2f\\+3"):
        aggregate_robust(stacked, np.ones(4), "multi_krum", f=1)
    aggregate_robust(np.zeros((5, 3), np.float32), np.ones(5), "multi_krum", f=1)


def test_multi_krum_drops_outlier_and_median_resists_it():
    rng = np.random.default_rng(0)
    honest = rng.normal(0, 0.1, size=(5, 10)).astype(np.float32)
    attack = np.full((1, 10), 100.0, np.float32)
    stacked = np.concatenate([honest, attack])
    out, chosen = multi_krum(stacked, np.ones(6), f=1)
    assert 5 not in chosen and np.abs(out).max() < 1.0
    assert np.abs(aggregate_robust(stacked, np.ones(6), "median")).max() < 1.0
    assert krum_scores(stacked, 1)[5] > krum_scores(stacked, 1)[:5].max()


def test_norm_clipping_bounds_influence():
    ref = np.zeros(4, np.float32)
    stacked = np.zeros((4, 4), np.float32)
    stacked[0] = [1000.0, 0, 0, 0]
    out, scales = norm_clip_mean(stacked, np.full(4, 0.25), clip_norm=2.0, reference=ref)
    assert np.linalg.norm(out - ref) <= 2.0 / 4 + 1e-6
    assert scales[0] == pytest.approx(0.002)


def test_robust_rejects_nan_and_unknown_rule():
    stacked = np.zeros((5, 3), np.float32)
    stacked[2, 1] = np.nan
    with pytest.raises(ValueError, match="update 2"):
        aggregate_robust(stacked, np.ones(5), "median")
    with pytest.raises(ValueError, match="bogus"):
        aggregate_robust(np.zeros((5, 3), np.float32), np.ones(5), "bogus")


def test_update_similarity_matches_direct_cosine_on_scattered_columns():
    from fed_ros.core.strategies.aggregate import all_finite, update_similarity

    rng = np.random.default_rng(5)
    stacked = rng.normal(size=(6, 5000)).astype(np.float32)
    origin = rng.normal(size=5000).astype(np.float32)
    cols = np.concatenate([np.arange(10, 1200), np.arange(3000, 4100)])
    direct = cosine_similarity_matrix(stacked[:, cols].astype(np.float64) - origin[cols])
    np.testing.assert_allclose(
        update_similarity(stacked, cols, origin, chunk=1024), direct, atol=1e-5
    )
    np.testing.assert_allclose(
        update_similarity(stacked, slice(0, 5000), origin),
        cosine_similarity_matrix(stacked.astype(np.float64) - origin),
        atol=1e-5,
    )
    assert all_finite(stacked)
    big = np.full(10, 3e38, np.float32)  # the float32 sum overflows, values are finite
    assert all_finite(big)
    big[3] = np.nan
    assert not all_finite(big)
