"""Aggregation and clustering maths, exactly: weighted averages and their weights, cosine
compatibility (CUA), spectral rebalancing (SRB), Jeffreys divergences and FeDepth soft
clusters, RND eps-sigma federations, and the clustered strategies built on them
(shared/methods.md). Hand-computable inputs, laws as hypothesis properties, and errors that
name the bad value.

ROS-free, no torch; deterministic (seeded).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fed_ros.core.strategies import aggregate as agg
from fed_ros.core.clustering import cua
from fed_ros.core.clustering import fedepth as fd
from fed_ros.core.clustering import rnd
from fed_ros.core.clustering import srb
from fed_ros.core.params import TensorSpec, flatten, manifest_of, unflatten
from fed_ros.core.strategies.ifca import ifca_select
from fed_ros.core.strategies.base import make_strategy
from fed_ros.core.strategies.types import ClientDescriptor, ClientUpdate

# ============================================================================ aggregate.py


def test_sample_weights_are_counts_over_their_sum_in_float64():
    w = agg.sample_weights([1, 3, 0, 4])
    assert w.dtype == np.float64
    np.testing.assert_array_equal(w, [0.125, 0.375, 0.0, 0.5])
    np.testing.assert_array_equal(agg.sample_weights((x for x in [2.0])), [1.0])  # any iterable


@pytest.mark.parametrize(
    "counts,names,message",
    [
        ([], None, "sample_weights: need at least one sample count"),
        ([[1, 2]], None, "need at least one sample count"),
        ([1, -2, 3], None, r"num_samples of index 1 is -2\.0; must be a finite count >= 0"),
        ([1, 2, float("nan")], None, "num_samples of index 2 is nan"),
        ([float("inf"), 1], ["a", "b"], "num_samples of a is inf"),
        ([1, -1], ["a", "b"], "num_samples of b is -1.0"),
        ([0, 0], None, r"num_samples sum to 0\.0; at least one client needs samples > 0"),
    ],
)
def test_sample_weights_refuse_bad_counts_naming_the_client(counts, names, message):
    with pytest.raises(ValueError, match=message):
        agg.sample_weights(counts, names)


def test_membership_matrix_rows_hold_each_groups_normalised_counts():
    W = agg.membership_matrix([[0, 2], [1], [2, 3, 0]], [1, 5, 3, 4], 4)
    assert W.dtype == np.float32 and W.shape == (3, 4)
    np.testing.assert_allclose(
        W, [[0.25, 0, 0.75, 0], [0, 1, 0, 0], [1 / 8, 0, 3 / 8, 4 / 8]], rtol=1e-7
    )


@pytest.mark.parametrize(
    "groups,counts,K,message",
    [
        ([[0]], [1, 2], 3, "membership_matrix: 2 sample counts for K=3"),
        ([[0], []], [1, 2], 2, "cluster 1 is empty"),
        ([[0, 2]], [1, 2], 2, r"cluster 0 has member index out of range 0\.\.1: \[0, 2\]"),
        ([[1], [-1]], [1, 2], 2, r"cluster 1 has member index out of range 0\.\.1: \[-1\]"),
        ([[0, 1]], [0, 0], 2, "num_samples sum to 0"),
        ([[1, 0]], [-1, 2], 2, "num_samples of member 0 is -1"),
    ],
)
def test_membership_matrix_refuses_bad_groups(groups, counts, K, message):
    with pytest.raises(ValueError, match=message):
        agg.membership_matrix(groups, counts, K)


def test_weighted_rows_is_one_product_for_one_or_many_clusters_and_writes_into_out():
    X = np.array([[1, 2, 3], [10, 20, 30]], np.float32)
    np.testing.assert_array_equal(
        agg.weighted_rows(X, np.array([0.25, 0.75])), [[7.75, 15.5, 23.25]]
    )
    W = np.array([[1, 0], [0.5, 0.5], [0, 1]], np.float64)
    out = np.full((3, 3), -1, np.float32)
    res = agg.weighted_rows(X, W, out=out)
    assert res is out
    np.testing.assert_array_equal(out, [[1, 2, 3], [5.5, 11, 16.5], [10, 20, 30]])
    one = np.zeros((1, 3), np.float32)
    assert agg.weighted_rows(X, np.array([[0.0, 1.0]]), out=one) is one
    np.testing.assert_array_equal(one, [[10, 20, 30]])
    fresh = agg.weighted_rows(X, W)
    assert fresh.dtype == np.float32 and fresh.base is None and fresh.flags.writeable


@pytest.mark.parametrize(
    "stacked,W,out,message",
    [
        (
            np.zeros(3, np.float32),
            np.ones(3),
            None,
            r"stacked must be \(K, P\) float32, got \(3,\) float32",
        ),
        (np.zeros((2, 3)), np.ones(2), None, r"got \(2, 3\) float64"),
        (
            np.zeros((2, 3), np.float32),
            np.ones(3),
            None,
            "weights for 3 clients but 2 stacked updates",
        ),
        (
            np.zeros((2, 3), np.float32),
            np.ones(2),
            np.zeros((1, 2), np.float32),
            r"out must be a writeable C-contiguous \(1, 3\) float32 array, got \(1, 2\) float32",
        ),
        (np.zeros((2, 3), np.float32), np.ones(2), np.zeros((1, 3)), r"got \(1, 3\) float64"),
        (
            np.zeros((2, 3), np.float32),
            np.ones(2),
            np.zeros((1, 6), np.float32)[:, ::2],
            "C-contiguous",
        ),
    ],
)
def test_weighted_rows_refuses_bad_shapes_and_out_buffers(stacked, W, out, message):
    with pytest.raises(ValueError, match=message):
        agg.weighted_rows(stacked, W, out=out)


def test_weighted_rows_refuses_a_readonly_out():
    out = np.zeros((1, 3), np.float32)
    out.flags.writeable = False
    with pytest.raises(ValueError, match="writeable"):
        agg.weighted_rows(np.ones((2, 3), np.float32), np.ones(2), out=out)


def test_weighted_average_of_rows():
    X = np.array([[2, 4], [6, 8], [0, 0]], np.float32)
    np.testing.assert_array_equal(agg.weighted_average(X, [0.5, 0.25, 0.25]), [2.5, 4.0])


@pytest.mark.parametrize(
    "arr,expected",
    [
        (np.array([1, 2, 3], np.float32), True),
        (np.array([1, np.nan, 3], np.float32), False),
        (np.array([1, -np.inf], np.float32), False),
        (np.array([[1.0, 2.0], [3.0, np.nan]], np.float64), False),
        (np.array([[1.0, 2.0], [3.0, 4.0]], np.float64), True),
        (np.arange(12, dtype=np.float32).reshape(3, 4).T, True),  # not contiguous
        (np.array([[1, np.inf], [3, 4]], np.float32).T, False),
        # |x| ~ 1e20: x.x overflows although every value is finite -> exact re-check says True
        (np.full(5, 1e20, np.float32), True),
        (np.array([1e20, 1e20, np.nan], np.float32), False),
        (np.array([3e38, -3e38], np.float32), True),  # the float32 sum overflows too
        (np.array([[3e38, 3e38], [1, 2]], np.float32).T, True),
    ],
)
def test_all_finite_is_exact_even_when_the_fast_pass_overflows(arr, expected):
    assert agg.all_finite(arr) is expected


def test_all_finite_rechecks_every_chunk_of_a_large_array():
    arr = np.full((1 << 20) + 5, 1e20, np.float32)
    assert agg.all_finite(arr) is True
    arr[-1] = np.nan
    assert agg.all_finite(arr) is False


def test_first_nonfinite_row_scans_every_chunk_of_every_row():
    X = np.zeros((3, 7), np.float32)
    assert agg.first_nonfinite_row(X) == -1
    assert agg.first_nonfinite_row(X, chunk=2) == -1
    X[2, 6] = np.inf
    X[1, 5] = np.nan
    assert agg.first_nonfinite_row(X, chunk=2) == 1
    assert agg.first_nonfinite_row(X) == 1
    X[0, 0] = -np.inf
    assert agg.first_nonfinite_row(X, chunk=3) == 0


def _sd2(a, b):
    return {"w": np.asarray(a, np.float32).reshape(2, 1), "b": np.asarray([b], np.float32)}


def test_fedavg_weights_state_dicts_by_sample_counts():
    out = agg.fedavg([_sd2([1, 2], 3), _sd2([5, 6], 7)], [1, 3])
    assert list(out) == ["w", "b"]
    np.testing.assert_array_equal(out["w"], [[4], [5]])
    np.testing.assert_array_equal(out["b"], [6])
    man = manifest_of(_sd2([0, 0], 0))
    out = agg.fedavg([_sd2([1, 2], 3), _sd2([5, 6], 7)], [3, 1], manifest=man)
    np.testing.assert_array_equal(out["w"], [[2], [3]])


def test_fedavg_refuses_empty_mismatched_and_nonfinite_updates_naming_them():
    with pytest.raises(ValueError, match="fedavg: no updates"):
        agg.fedavg([], [])
    with pytest.raises(ValueError, match="update 1: "):
        agg.fedavg([_sd2([1, 2], 3), {"w": np.zeros((2, 1), np.float32)}], [1, 1])
    with pytest.raises(ValueError, match="fedavg: 3 sample counts for 2 updates"):
        agg.fedavg([_sd2([1, 2], 3), _sd2([1, 2], 3)], [1, 1, 1])
    with pytest.raises(ValueError, match="update 2 holds NaN/Inf values"):
        agg.fedavg([_sd2([1, 2], 3), _sd2([1, 2], 3), _sd2([1, np.nan], 3)], [1, 1, 1])
    with pytest.raises(ValueError, match="update 0 holds NaN/Inf values"):
        agg.fedavg([_sd2([np.inf, 2], 3), _sd2([1, 2], 3)], [1, 0])


def test_fedavg_blames_overflow_not_a_robot(monkeypatch):
    monkeypatch.setattr(
        agg, "weighted_average", lambda stacked, w: np.full(stacked.shape[1], np.inf, np.float32)
    )
    with pytest.raises(ValueError, match="fedavg overflowed to Inf"):
        agg.fedavg([_sd2([1, 2], 3)], [1])


@settings(derandomize=True, max_examples=25, deadline=None)
@given(st.lists(st.integers(1, 50), min_size=2, max_size=6), st.integers(0, 10_000))
def test_fedavg_is_permutation_invariant_and_returns_identical_models(counts, seed):
    rng = np.random.default_rng(seed)
    sds = [_sd2(rng.normal(size=2), rng.normal()) for _ in counts]
    perm = rng.permutation(len(counts))
    a = agg.fedavg(sds, counts)
    b = agg.fedavg([sds[i] for i in perm], [counts[i] for i in perm])
    for k in a:
        np.testing.assert_allclose(a[k], b[k], rtol=1e-5, atol=1e-6)
    same = agg.fedavg([sds[0]] * len(counts), counts)
    for k in same:
        np.testing.assert_allclose(same[k], sds[0][k], rtol=1e-6)


def test_cosine_of_known_update_vectors():
    V = np.array([[1, 0, 0], [2, 0, 0], [1, 1, 0], [0, 0, 0], [-3, 0, 0]], np.float32)
    S = agg.cosine_similarity_matrix(V)
    assert S.dtype == np.float64
    r = 1 / math.sqrt(2)
    expected = np.array(
        [[1, 1, r, 0, -1], [1, 1, r, 0, -1], [r, r, 1, 0, -r], [0, 0, 0, 1, 0], [-1, -1, -r, 0, 1]]
    )
    np.testing.assert_allclose(S, expected, atol=1e-12)
    with pytest.raises(
        ValueError, match=r"cosine_similarity_matrix expects \(K, D\), got shape \(3,\)"
    ):
        agg.cosine_similarity_matrix(np.ones(3))


def test_gram_to_cosine_clips_rounding_and_treats_negative_diagonals_as_zero():
    G = np.array([[1.0, 1.5], [1.5, 1.0]])  # inconsistent Gram: cosine would be 1.5
    np.testing.assert_array_equal(agg.gram_to_cosine(G), [[1, 1], [1, 1]])
    G = np.array([[1.0, -1.5], [-1.5, 1.0]])
    np.testing.assert_array_equal(agg.gram_to_cosine(G), [[1, -1], [-1, 1]])
    G = np.array([[-1e-18, 0.5], [0.5, 4.0]])  # rounding made a zero vector's norm negative
    np.testing.assert_array_equal(agg.gram_to_cosine(G), [[1, 0], [0, 1]])
    G = np.array([[4.0, 2.0, 0.0], [2.0, 1.0, 0.0], [0.0, 0.0, 0.0]])
    np.testing.assert_allclose(agg.gram_to_cosine(G), [[1, 1, 0], [1, 1, 0], [0, 0, 1]])


@pytest.mark.parametrize(
    "columns", [slice(1, 6), np.array([0, 2, 3, 5]), np.arange(0, 1500, 3), slice(0, 1500)]
)
def test_update_similarity_is_the_cosine_of_updates_from_the_origin(columns):
    rng = np.random.default_rng(3)
    stacked = rng.normal(size=(4, 1500)).astype(np.float32)
    origin = rng.normal(size=1500).astype(np.float32)
    V = (stacked - origin)[:, columns]
    expected = agg.cosine_similarity_matrix(V.astype(np.float64))
    for chunk in (1, 1 << 16):
        np.testing.assert_allclose(
            agg.update_similarity(stacked, columns, origin, chunk=chunk), expected, atol=1e-6
        )


def test_update_similarity_of_updates_equal_to_the_origin_or_opposite():
    origin = np.array([1, 1, 1], np.float32)
    stacked = np.array([[2, 1, 1], [0, 1, 1], [1, 1, 1], [1, 3, 1]], np.float32)
    S = agg.update_similarity(stacked, slice(0, 3), origin)
    np.testing.assert_allclose(
        S, [[1, -1, 0, 0], [-1, 1, 0, 0], [0, 0, 1, 0], [0, 0, 0, 1]], atol=1e-12
    )


@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")
def test_update_similarity_names_the_nonfinite_update():
    stacked = np.zeros((3, 4), np.float32)
    stacked[2, 1] = np.nan
    with pytest.raises(ValueError, match="update 2 holds NaN/Inf values"):
        agg.update_similarity(stacked, slice(0, 4), np.zeros(4, np.float32))
    stacked[2, 1] = 0
    stacked[1, 3] = np.inf
    with pytest.raises(ValueError, match="update 1 holds NaN/Inf values"):
        agg.update_similarity(stacked, np.array([1, 3]), np.zeros(4, np.float32))


def test_kl_and_jeffreys_of_known_gaussians():
    # KL(N(0,1) || N(1,2)) = 1/2 (log 2 + (1 + 1)/2 - 1) = log(2)/2;
    # reverse = 1/2 (log 1/2 + 2 + 1 - 1)
    assert agg.kl_diag_gaussian([0.0], [1.0], [1.0], [2.0]) == pytest.approx(0.5 * math.log(2))
    assert agg.kl_diag_gaussian([1.0], [2.0], [0.0], [1.0]) == pytest.approx(
        0.5 * (2 - math.log(2))
    )
    assert agg.jeffreys_diag([0.0], [1.0], [1.0], [2.0]) == pytest.approx(1.0)
    # Two dimensions add; equal variances: J = sum (m_i - m_j)^2 / v
    assert agg.jeffreys_diag([0, 0], [2, 2], [2, 4], [2, 2]) == pytest.approx((4 + 16) / 2)
    assert agg.kl_diag_gaussian([3, -1], [0.5, 4], [3, -1], [0.5, 4]) == 0.0


def test_jeffreys_matrix_matches_the_pairwise_formula_on_both_paths():
    rng = np.random.default_rng(0)
    for K, D in ((5, 3), (60, 5600)):  # 60*60*5600 > 20M: the GEMM expansion
        m = rng.normal(size=(K, D))
        v = rng.uniform(0.5, 2.0, size=(K, D))
        J = fd.jeffreys_matrix(m, v)
        assert J.shape == (K, K) and (np.diag(J) == 0).all() and (J >= 0).all()
        np.testing.assert_allclose(J, J.T, rtol=1e-12)
        for i, j in ((0, 1), (2, 4), (4, 0)):
            assert J[i, j] == pytest.approx(agg.jeffreys_diag(m[i], v[i], m[j], v[j]), rel=1e-9)
        np.testing.assert_allclose(
            fd.jeffreys_to_each(m[1], v[1], m, v), J[1], rtol=1e-9, atol=1e-6
        )


def test_jeffreys_matrix_large_path_of_identical_descriptors_is_zero():
    m = np.tile(np.linspace(-3, 3, 5600), (60, 1))
    J = agg.jeffreys_matrix(m, np.full_like(m, 0.7))
    # the expansion cancels large terms: rounding residue only, clamped at 0 (never negative)
    assert (J >= 0).all() and np.abs(J).max() < 1e-8 and (np.diag(J) == 0).all()


@settings(derandomize=True, max_examples=25, deadline=None)
@given(st.integers(0, 10_000), st.integers(1, 4))
def test_jeffreys_is_symmetric_nonnegative_and_zero_on_identical_gaussians(seed, D):
    rng = np.random.default_rng(seed)
    m = rng.normal(size=(3, D))
    v = rng.uniform(0.1, 3.0, size=(3, D))
    m[2], v[2] = m[0], v[0]
    J = agg.jeffreys_matrix(m, v)
    assert J[0, 2] == 0 and J[2, 0] == 0
    assert J[0, 1] == pytest.approx(J[1, 0]) and J[0, 1] > 0
    assert agg.jeffreys_diag(m[0], v[0], m[1], v[1]) == pytest.approx(
        agg.jeffreys_diag(m[1], v[1], m[0], v[0])
    )
    assert agg.jeffreys_diag(m[0], v[0], m[0], v[0]) == 0.0


@pytest.mark.parametrize(
    "means,variances,message",
    [
        (
            np.zeros(3),
            np.ones(3),
            r"jeffreys_matrix: means \(3,\) and variances \(3,\) must both be \(K, D\)",
        ),
        (np.zeros((2, 3)), np.ones((2, 2)), r"means \(2, 3\) and variances \(2, 2\)"),
        (np.array([[0.0, np.nan]]), np.ones((1, 2)), "jeffreys_matrix: descriptors hold NaN/Inf"),
        (np.zeros((1, 2)), np.array([[1.0, np.inf]]), "descriptors hold NaN/Inf"),
        (
            np.zeros((3, 2)),
            np.array([[1.0, 1], [1, 1], [1, 0]]),
            "jeffreys_matrix: descriptor 2 has a variance <= 0",
        ),
        (np.zeros((3, 2)), np.array([[1.0, 1], [-1, 1], [1, 1]]), "descriptor 1 has a variance"),
    ],
)
def test_jeffreys_matrix_refuses_bad_descriptors_naming_them(means, variances, message):
    with pytest.raises(ValueError, match=message):
        agg.jeffreys_matrix(means, variances)


def test_weighted_model_is_the_normalised_mean_of_positive_weight_clusters():
    models = {
        0: {"w": np.array([0.0, 4.0], np.float32)},
        3: {"w": np.array([8.0, 0.0], np.float32)},
        5: {"w": np.array([100.0, 100.0], np.float32)},
    }
    out = agg.weighted_model(models, [(0, 0.2), (3, 0.6), (5, 0.0)])
    np.testing.assert_allclose(out["w"], [6.0, 1.0], rtol=1e-6)
    assert out["w"].dtype == np.float32
    single = agg.weighted_model(models, [(5, 0.0), (3, 0.5)])
    np.testing.assert_array_equal(single["w"], [8.0, 0.0])
    single["w"][0] = -1  # a fresh copy, never the cluster model itself
    assert models[3]["w"][0] == 8.0
    with pytest.raises(
        ValueError, match=r"membership \[\(0, 0\.0\), \(3, -1\.0\)\] has no cluster with weight > 0"
    ):
        agg.weighted_model(models, [(0, 0.0), (3, -1.0)])


# ================================================================================== cua.py

S4 = np.array(
    [[1.0, 0.9, 0.1, 0.2], [0.9, 1.0, 0.3, 0.0], [0.1, 0.3, 1.0, 0.8], [0.2, 0.0, 0.8, 1.0]]
)


def _same_partition(a, b) -> bool:
    a, b = np.asarray(a).tolist(), np.asarray(b).tolist()
    return len(set(zip(a, b))) == len(set(a)) == len(set(b))


def test_cua_result_groups_are_ordered_by_smallest_member():
    res = cua.CUAResult(np.array([1, 0, 1, 2, 0]), 0.5, "exact")
    assert res.groups() == [[0, 2], [1, 4], [3]]
    assert cua.CUAResult(np.array([2, 2, 0, 0]), 0.0, "x").groups() == [
        [0, 1],
        [2, 3],
    ]  # label 1 unused
    assert cua.CUAResult(np.zeros(0, dtype=np.int64), 0.0, "x").groups() == []


def test_stirling_numbers_of_the_second_kind():
    assert cua.stirling2(0, 0) == 1 and cua.stirling2(3, 0) == 0 and cua.stirling2(0, 2) == 0
    assert [cua.stirling2(5, k) for k in range(7)] == [0, 1, 15, 25, 10, 1, 0]
    assert cua.stirling2(2, 5) == 0
    with pytest.raises(ValueError, match="stirling2 needs n, k >= 0, got -1, 2"):
        cua.stirling2(-1, 2)
    with pytest.raises(ValueError, match="got 3, -1"):
        cua.stirling2(3, -1)


@pytest.mark.parametrize(
    "S,C,message",
    [
        (np.ones((2, 3)), 1, r"similarity matrix must be square, got shape \(2, 3\)"),
        (np.ones(3), 1, r"got shape \(3,\)"),
        (np.array([[1.0, np.inf], [np.inf, 1.0]]), 1, "similarity matrix holds NaN/Inf"),
        (np.eye(3), 0, "num_clusters C must be an int >= 1, got 0"),
        (np.eye(3), 2.0, "num_clusters C must be an int >= 1, got 2.0"),
        (np.eye(3), "2", "got '2'"),
        (np.eye(2), 3, r"cannot split K=2 clients into C=3 non-empty groups \(K < C\)"),
    ],
)
def test_cua_refuses_bad_similarity_matrices_and_cluster_counts(S, C, message):
    for call in (
        lambda: cua.cua_partition(S, C),
        lambda: cua.cua_exact(S, C),
        lambda: cua.cua_scalable(S, C),
    ):
        with pytest.raises(ValueError, match=message):
            call()


def test_cua_accepts_numpy_integer_c_and_k_equal_c():
    res = cua.cua_partition(S4, np.int64(4))
    assert res.labels.tolist() == [0, 1, 2, 3]
    assert cua.cua_partition(S4, 1).labels.tolist() == [0, 0, 0, 0]


def test_cua_objective_by_hand_and_symmetrised():
    # {0,1} {2,3}: intra means 0.9, 0.8; inter (0.1+0.2+0.3+0)/4
    assert cua.cua_objective(S4, [0, 0, 1, 1]) == pytest.approx(0.85 - 0.15)
    assert cua.cua_objective(S4, np.array([1, 1, 0, 0])) == pytest.approx(0.85 - 0.15)
    # one group (C = 1): the mean of all distinct pairs, no inter term
    assert cua.cua_objective(S4, [0, 0, 0, 0]) == pytest.approx(
        (0.9 + 0.1 + 0.2 + 0.3 + 0.0 + 0.8) / 6
    )
    # singleton intra is the setting; C = 4 -> inter over binom(4,2) = 6 pairs of groups
    assert cua.cua_objective(S4, [0, 1, 2, 3]) == pytest.approx(0 - 2.3 / 6)
    assert cua.cua_objective(S4, [0, 1, 2, 3], singleton_intra=0.5) == pytest.approx(0.5 - 2.3 / 6)
    # an asymmetric matrix is read as (S + S^T)/2; its diagonal never counts
    A = S4.copy()
    A[0, 1], A[1, 0] = 1.3, 0.5
    A[2, 2] = 7.0
    assert cua.cua_objective(A, [0, 0, 1, 1]) == pytest.approx(0.85 - 0.15)
    # explicit C larger than the labels used: the unused group is empty
    with pytest.raises(ValueError, match="group 2 of the partition is empty"):
        cua.cua_objective(S4, [0, 1, 0, 1], C=3)


@pytest.mark.parametrize(
    "labels,message",
    [
        ([0, 0, 1], r"labels must be \(K,\)=4 values in 0\.\.1, got \[0, 0, 1\]"),
        ([0, -1, 1, 1], r"values in 0\.\.1, got \[0, -1, 1, 1\]"),
        ([0, 2, 1, 1], r"in 0\.\.1, got \[0, 2, 1, 1\]"),
    ],
)
def test_cua_objective_refuses_bad_labels(labels, message):
    with pytest.raises(ValueError, match=message):
        cua.cua_objective(S4, labels, C=2)


def test_enumerate_partitions_lists_each_restricted_growth_string_once_in_colex_order():
    assert cua.enumerate_partitions(1, 1).tolist() == [[0]]
    assert cua.enumerate_partitions(3, 1).tolist() == [[0, 0, 0]]
    assert cua.enumerate_partitions(3, 3).tolist() == [[0, 1, 2]]
    # built position by position, the last position varying slowest (colexicographic order)
    assert cua.enumerate_partitions(4, 2).tolist() == [
        [0, 1, 0, 0],
        [0, 0, 1, 0],
        [0, 1, 1, 0],
        [0, 0, 0, 1],
        [0, 1, 0, 1],
        [0, 0, 1, 1],
        [0, 1, 1, 1],
    ]
    parts = cua.enumerate_partitions(6, 3)
    assert parts.dtype == np.int8 and parts.shape == (90, 6)
    assert [tuple(p) for p in parts.tolist()] == sorted(
        {tuple(p) for p in parts.tolist()}, key=lambda p: p[::-1]
    )
    for p in parts.tolist():
        assert p[0] == 0 and set(p) == {0, 1, 2}
        assert all(p[i] <= max(p[:i]) + 1 for i in range(1, 6))
    for K, C, message in ((2, 3, "K=2 into C=3"), (3, 0, "K=3 into C=0")):
        with pytest.raises(ValueError, match=f"cannot enumerate partitions of {message} groups"):
            cua.enumerate_partitions(K, C)


@settings(derandomize=True, max_examples=15, deadline=None)
@given(st.integers(0, 10_000), st.integers(3, 7), st.integers(1, 3))
def test_exact_cua_finds_the_best_partition_and_keeps_the_first_of_ties(seed, K, C):
    rng = np.random.default_rng(seed)
    if K < C:
        return
    S = agg.cosine_similarity_matrix(rng.normal(size=(K, 3)))
    parts = cua.enumerate_partitions(K, C)
    vals = np.array([cua.cua_objective(S, p, C) for p in parts])
    for batch in (1, 7, 50_000):
        res = cua.cua_exact(S, C, batch=batch)
        assert res.method == "exact" and res.labels.dtype == np.int64
        assert res.objective == pytest.approx(vals.max(), abs=1e-12)
        first = int(np.flatnonzero(vals > vals.max() - 1e-12)[0])
        assert res.labels.tolist() == parts[first].tolist()


def test_exact_cua_ties_keep_the_first_enumerated_partition():
    S = np.eye(5)  # every partition scores 0: all ties
    for batch in (1, 4, 100):
        assert cua.cua_exact(S, 2, batch=batch).labels.tolist() == [0, 1, 0, 0, 0]
        assert cua.cua_exact(S, 2, batch=batch).objective == 0.0


def test_exact_cua_refuses_too_many_partitions_naming_the_count():
    S = np.eye(8)
    with pytest.raises(
        ValueError, match=r"exact CUA over S\(8,3\) = 966 partitions exceeds max_partitions=965"
    ):
        cua.cua_exact(S, 3, max_partitions=965)
    assert cua.cua_exact(S, 3, max_partitions=966).labels.size == 8


def test_singleton_intra_decides_whether_a_noisy_robot_is_split_off():
    # two real groups {0,1,2} and {3,4}; robot 2 is mildly noisy
    S = np.array(
        [
            [1.0, 0.9, 0.5, -0.5, -0.5],
            [0.9, 1.0, 0.5, -0.5, -0.5],
            [0.5, 0.5, 1.0, -0.4, -0.4],
            [-0.5, -0.5, -0.4, 1.0, 0.9],
            [-0.5, -0.5, -0.4, 0.9, 1.0],
        ]
    )
    assert cua.cua_partition(S, 3).groups() == [[0, 1], [2], [3, 4]]
    assert cua.cua_partition(S, 2).groups() == [[0, 1, 2], [3, 4]]
    with_one = cua.cua_partition(S, 2, singleton_intra=1.0)
    assert with_one.objective == pytest.approx(
        max(cua.cua_objective(S, p, 2, 1.0) for p in cua.enumerate_partitions(5, 2))
    )


def _planted(seed, K, C, noise=0.3, D=30):
    rng = np.random.default_rng(seed)
    centers = rng.normal(size=(C, D)) * 3
    labels = np.concatenate([np.repeat(np.arange(C), 2), rng.integers(0, C, size=K - 2 * C)])
    rng.shuffle(labels)
    V = centers[labels] + noise * rng.normal(size=(K, D))
    return agg.cosine_similarity_matrix(V), labels


@settings(derandomize=True, max_examples=20, deadline=None)
@given(st.integers(0, 10_000), st.integers(5, 11), st.integers(2, 4), st.booleans())
def test_scalable_cua_reaches_the_exact_optimum_on_small_fleets(seed, K, C, planted):
    if K < 2 * C:
        return
    rng = np.random.default_rng(seed)
    S = (
        _planted(seed, K, C)[0]
        if planted
        else agg.cosine_similarity_matrix(rng.normal(size=(K, 4)))
    )
    exact = cua.cua_exact(S, C)
    fast = cua.cua_scalable(S, C, seed=seed)
    assert fast.method == "scalable"
    # a heuristic: never above the optimum, and on it when the fleet has real groups
    assert fast.objective <= exact.objective + 1e-9
    if planted:
        assert fast.objective == pytest.approx(exact.objective, abs=1e-9)
    assert fast.objective == pytest.approx(cua.cua_objective(S, fast.labels, C), abs=1e-9)
    # canonical labels: groups numbered in order of first appearance
    first = [int(np.flatnonzero(fast.labels == c)[0]) for c in range(C)]
    assert first == sorted(first) and set(fast.labels.tolist()) == set(range(C))


@pytest.mark.parametrize("K,C,seed", [(20, 2, 0), (70, 3, 1), (300, 4, 2)])
def test_scalable_cua_recovers_planted_groups_of_larger_fleets(K, C, seed):
    S, truth = _planted(seed, K, C)
    res = cua.cua_scalable(S, C, seed=seed)
    assert _same_partition(res.labels, truth)
    assert res.objective == pytest.approx(cua.cua_objective(S, res.labels, C), abs=1e-9)


def test_scalable_cua_with_one_cluster_is_everyone_together():
    res = cua.cua_scalable(S4, 1)
    assert res.labels.tolist() == [0, 0, 0, 0] and res.method == "scalable"
    assert res.objective == pytest.approx(cua.cua_objective(S4, [0, 0, 0, 0]))
    assert cua.cua_scalable(S4, 1, singleton_intra=5.0).objective == pytest.approx(0.383333333333)


def test_scalable_cua_splits_two_obvious_groups_even_with_one_outlier():
    # K = 9: groups {0..3}, {4..7} and robot 8 opposite to everyone; C = 3 puts it alone.
    V = np.zeros((9, 3))
    V[:4, 0] = 1
    V[4:8, 1] = 1
    V[8] = [-1, -1, 0]
    V[:8] += 0.05 * np.random.default_rng(0).normal(size=(8, 3))
    S = agg.cosine_similarity_matrix(V)
    for method in ("exact", "scalable"):
        assert cua.cua_partition(S, 3, method=method).groups() == [[0, 1, 2, 3], [4, 5, 6, 7], [8]]


def test_local_search_ends_in_a_local_optimum_with_the_true_objective():
    rng = np.random.default_rng(5)
    for C in (2, 3):
        S = agg.cosine_similarity_matrix(rng.normal(size=(9, 3)))
        S0 = S.copy()
        np.fill_diagonal(S0, 0.0)
        start = np.array([0, 1, 2, 0, 1, 2, 0, 1, 2]) % C
        labels, val = cua._local_search(S0, start, C, 0.0, max_moves=100)
        assert val == pytest.approx(cua.cua_objective(S, labels, C), abs=1e-12)
        assert val >= cua.cua_objective(S, start, C) - 1e-12
        for i in range(9):  # no single move improves and no group is emptied
            for t in range(C):
                moved = labels.copy()
                moved[i] = t
                if t != labels[i] and np.bincount(labels, minlength=C)[labels[i]] > 1:
                    assert cua.cua_objective(S, moved, C) <= val + 1e-12
        stuck, v0 = cua._local_search(S0, start, C, 0.0, max_moves=0)
        assert stuck.tolist() == start.tolist()
        assert v0 == pytest.approx(cua.cua_objective(S, start, C))


def test_local_search_takes_the_best_move_first():
    S = np.array([[1.0, 0.9, -0.9], [0.9, 1.0, -0.8], [-0.9, -0.8, 1.0]])
    S0 = S - np.eye(3)
    labels, val = cua._local_search(S0, np.array([0, 1, 1]), 2, 0.0, max_moves=1)
    assert labels.tolist() == [0, 0, 1]
    assert val == pytest.approx(cua.cua_objective(S, [0, 0, 1]))


def test_repair_fills_empty_groups_with_the_least_attached_member():
    S = np.array(
        [[1.0, 0.9, 0.8, 0.1], [0.9, 1.0, 0.7, 0.0], [0.8, 0.7, 1.0, 0.2], [0.1, 0.0, 0.2, 1.0]]
    )
    S0 = S - np.eye(4)
    # all in group 0: robot 3 has the least mean similarity to its group -> moves to group 1
    assert cua._repair(np.array([0, 0, 0, 0]), S0, 2).tolist() == [0, 0, 0, 1]
    out = cua._repair(np.array([1, 1, 1, 1]), S0, 2)
    assert out.tolist() == [1, 1, 1, 0]
    three = cua._repair(np.array([0, 0, 0, 0]), S0, 3)
    assert sorted(np.bincount(three, minlength=3).tolist()) == [1, 1, 2] and three[3] == 1
    # a singleton group is never emptied to fill another one
    lab = np.array([0, 0, 0, 2])
    # (robot 2 is the least attached of the big group {0,1,2}: mean 0.75 vs 0.85 and 0.8)
    assert cua._repair(lab, S0, 3).tolist() == [0, 0, 1, 2]
    start = np.array([0, 0, 0, 1])
    assert cua._repair(start, S0, 2) is not start


def test_batch_refine_moves_each_robot_to_its_most_similar_group():
    V = np.zeros((6, 2))
    V[:3, 0] = 1
    V[3:, 1] = 1
    V += 0.1 * np.random.default_rng(0).normal(size=(6, 2))
    S0 = agg.cosine_similarity_matrix(V) - np.eye(6)
    assert cua._batch_refine(S0, np.array([0, 0, 1, 0, 1, 1]), 2).tolist() == [0, 0, 0, 1, 1, 1]
    assert cua._batch_refine(S0, np.array([1, 1, 0, 0, 0, 0]), 2).tolist() == [1, 1, 1, 0, 0, 0]
    assert cua._batch_refine(S0, np.array([0, 1, 0, 1, 0, 1]), 2, iters=0).tolist() == [
        0,
        1,
        0,
        1,
        0,
        1,
    ]
    start = np.array([0, 0, 0, 1, 1, 1])
    assert cua._batch_refine(S0, start, 2).tolist() == start.tolist()


def test_starts_split_two_obvious_groups():
    V = np.zeros((8, 2))
    V[:5, 0] = 1
    V[5:, 1] = 1
    V += 0.05 * np.random.default_rng(1).normal(size=(8, 2))
    S = agg.cosine_similarity_matrix(V)
    S0 = S - np.eye(8)
    truth = [0] * 5 + [1] * 3
    assert _same_partition(cua._agglomerative_start(S, 2), truth)
    assert _same_partition(cua._spectral_start(S, 2, seed=0), truth)
    peel = cua._peel_start(S0, 2, 0.0)
    assert sorted(np.bincount(peel).tolist()) == [1, 7]
    # the peeled robot is the one whose removal helps J most
    best = max(range(8), key=lambda i: cua.cua_objective(S, np.eye(8, dtype=int)[i], 2))
    assert np.flatnonzero(peel == 1).tolist() == [best]
    peel3 = cua._peel_start(S0, 3, 0.0)
    assert sorted(np.bincount(peel3).tolist()) == [1, 1, 6]


def test_canonical_relabels_in_order_of_first_appearance():
    assert cua._canonical(np.array([2, 2, 0, 1, 0])).tolist() == [0, 0, 1, 2, 1]
    assert cua._canonical(np.array([0, 1, 1])).tolist() == [0, 1, 1]


def test_cua_partition_auto_uses_exact_only_for_small_feasible_fleets():
    S, _ = _planted(0, 13, 2)
    assert cua.cua_partition(S, 2).method == "scalable"  # K = 13 > 12
    assert cua.cua_partition(S, 2, exact_max_k=13).method == "exact"
    assert cua.cua_partition(S, 2, method="exact").method == "exact"
    S12 = S[:12, :12]
    assert cua.cua_partition(S12, 2).method == "exact"
    assert cua.cua_partition(S12, 2, method="scalable").method == "scalable"
    assert (
        cua.cua_partition(S12, 2, exact_max_partitions=2046).method == "scalable"
    )  # S(12,2) = 2047
    assert cua.cua_partition(S12, 2, exact_max_partitions=2047).method == "exact"
    with pytest.raises(ValueError, match="exceeds max_partitions=10"):
        cua.cua_partition(S12, 2, method="exact", exact_max_partitions=10)
    with pytest.raises(
        ValueError, match=r"CUA method 'best' not in \('auto', 'exact', 'scalable'\)"
    ):
        cua.cua_partition(S12, 2, method="best")


def test_cua_partition_passes_singleton_intra_and_seed():
    S = np.array([[1.0, 0.2, 0.2], [0.2, 1.0, 0.9], [0.2, 0.9, 1.0]])
    a = cua.cua_partition(S, 2, singleton_intra=1.0)
    assert a.objective == pytest.approx(cua.cua_objective(S, a.labels, 2, 1.0))
    assert a.objective == pytest.approx((1.0 + 0.9) / 2 - 0.2)
    b = cua.cua_partition(S, 2, method="scalable", singleton_intra=1.0, seed=3)
    assert b.objective == pytest.approx(a.objective)


# ================================================================================== srb.py


def _with_sigma(sigma, m=6, n=5, seed=0):
    rng = np.random.default_rng(seed)
    U, _ = np.linalg.qr(rng.normal(size=(m, len(sigma))))
    V, _ = np.linalg.qr(rng.normal(size=(n, len(sigma))))
    return (U * np.asarray(sigma)) @ V.T, U, V


def test_threshold_index_is_the_first_cumulative_share_reaching_beta():
    s = np.array([1.0, 1.0, 1.0, 1.0])  # shares .25 .5 .75 1 (exact in binary)
    assert [srb.threshold_index(s, b) for b in (0.0, 0.25, 0.26, 0.5, 0.75, 0.76, 1.0)] == [
        0,
        0,
        1,
        1,
        2,
        3,
        3,
    ]
    assert srb.threshold_index(np.array([0.1] * 10), 1.0) == 9  # 0.1 sums to 0.9999999999999999
    assert srb.threshold_index(np.array([]), 0.9) == 0
    assert srb.threshold_index(np.zeros(3), 0.9) == 0
    assert srb.threshold_index([5.0], 0.9) == 0
    for bad in (-0.01, 1.01, float("nan")):
        with pytest.raises(ValueError, match=f"SRB beta must be in \\[0, 1\\], got {bad!r}"):
            srb.threshold_index(s, bad)


def test_rebalanced_singular_values_raise_the_tail_to_sigma_c_star():
    np.testing.assert_array_equal(
        srb.rebalanced_singular_values(np.array([8.0, 4, 2, 1, 0.5]), 0.9), [8, 4, 2, 2, 2]
    )
    np.testing.assert_array_equal(srb.rebalanced_singular_values([3.0, 1.0], 0.0), [3, 3])
    np.testing.assert_array_equal(srb.rebalanced_singular_values([3.0, 1.0], 1.0), [3, 1])
    empty = np.zeros(0)
    out = srb.rebalanced_singular_values(empty, 0.9)
    assert out.size == 0 and out is not empty


def test_srb_block_exact_on_known_spectrum_in_place_and_into_out():
    D, U, V = _with_sigma([8.0, 4.0, 2.0, 1.0, 0.5])
    D = D.astype(np.float32)
    expected = (U * np.array([8.0, 4, 2, 2, 2])) @ V.T
    out, info = srb.srb_block(D, 0.9)
    assert out is not D and out.dtype == np.float32
    np.testing.assert_allclose(out, expected, atol=1e-5)
    assert (info.c_star, info.rank, info.raised) == (3, 5, 2)
    assert info.sigma_c == pytest.approx(2.0, rel=1e-5)
    assert info.norm_before == pytest.approx(math.sqrt(64 + 16 + 4 + 1 + 0.25), rel=1e-5)
    assert info.norm_after == pytest.approx(math.sqrt(64 + 16 + 4 + 4 + 4), rel=1e-5)
    assert info.to_json() == {
        "c_star": 3,
        "sigma_c": info.sigma_c,
        "rank": 5,
        "raised": 2,
        "norm_before": info.norm_before,
        "norm_after": info.norm_after,
    }
    buf = np.full_like(D, 99.0)
    out2, _ = srb.srb_block(D, 0.9, out=buf)
    assert out2 is buf
    np.testing.assert_allclose(buf, expected, atol=1e-5)
    same = D.copy()
    out3, _ = srb.srb_block(same, 0.9, out=same)
    assert out3 is same
    np.testing.assert_allclose(same, expected, atol=1e-5)


def test_srb_block_counts_rank_and_raises_only_smaller_values():
    D, _, _ = _with_sigma([4.0, 2.0, 1e-9], m=5, n=4)  # numerically rank 2
    _, info = srb.srb_block(D.astype(np.float64), 0.5)
    assert info.rank == 2 and info.c_star == 1 and info.raised == 3  # 4 singular values, 3 below 4
    D = np.vstack([2 * np.eye(3), np.zeros((1, 3))]).astype(np.float32)  # flat: nothing to raise
    out, info = srb.srb_block(D, 0.5)
    assert info.raised == 0 and info.c_star == 2
    np.testing.assert_allclose(out, D, atol=1e-6)
    assert info.norm_after == pytest.approx(info.norm_before, rel=1e-6)


def test_srb_rank_uses_the_matrix_rank_tolerance_sigma_1_max_dim_float32_eps():
    # tolerance = sigma_1 * max(m, n) * eps(float32) = 5 * 1.19e-7 = 5.96e-7 for a 5 x 4 block
    for s2, rank in ((5e-7, 1), (7e-7, 2)):
        D, _, _ = _with_sigma([1.0, s2], m=5, n=4)
        assert srb.srb_block(D, 0.99)[1].rank == rank, s2


def test_srb_block_leaves_zero_and_nonfinite_blocks_alone():
    z, info = srb.srb_block(np.zeros((3, 2), np.float32), 0.9)
    assert not z.any() and info == srb.SRBInfo(0, 0.0, 0, 0, 0.0, 0.0)
    bad = np.ones((3, 2), np.float32)
    bad[0, 0] = np.nan
    out, info = srb.srb_block(bad, 0.9)
    assert np.isnan(out[0, 0]) and (out.ravel()[1:] == 1).all()
    assert info.c_star == 0 and info.raised == 0 and math.isnan(info.norm_before)
    with pytest.raises(ValueError, match=r"SRB needs a 2-D block, got shape \(4,\)"):
        srb.srb_block(np.ones(4, np.float32), 0.9)


def test_eligible_blocks_are_2d_matrices_by_min_dim_prefix_and_exclusion():
    man = (
        TensorSpec("enc.w", (4, 3)),
        TensorSpec("enc.b", (4,)),
        TensorSpec("temporal.w", (5, 5)),
        TensorSpec("temporal.row", (1, 5)),
        TensorSpec("head.w", (2, 8)),
        TensorSpec("conv", (2, 2, 2)),
    )
    assert srb.eligible_blocks(man) == ["enc.w", "temporal.w", "head.w"]
    assert srb.eligible_blocks(man, min_dim=1) == ["enc.w", "temporal.w", "temporal.row", "head.w"]
    assert srb.eligible_blocks(man, min_dim=3) == ["enc.w", "temporal.w"]
    assert srb.eligible_blocks(man, prefixes=["temporal.", "head."]) == ["temporal.w", "head.w"]
    assert srb.eligible_blocks(man, prefixes=[]) == ["enc.w", "temporal.w", "head.w"]
    assert srb.eligible_blocks(man, exclude=["enc", "head"]) == ["temporal.w"]
    assert srb.eligible_blocks(man, prefixes=["enc"], exclude=["enc.w"]) == []


def test_apply_srb_rebalances_named_blocks_of_a_flat_update_in_place():
    D, U, V = _with_sigma([8.0, 4.0, 2.0, 1.0, 0.5])
    man = (TensorSpec("b", (3,)), TensorSpec("w", (6, 5)), TensorSpec("v", (2, 2)))
    flat = np.concatenate([[1, 2, 3], D.ravel(), [1, 0, 0, 0]]).astype(np.float32)
    info = srb.apply_srb(flat, man, 0.9, ["w"])
    assert list(info) == ["w"] and info["w"].c_star == 3
    np.testing.assert_array_equal(flat[:3], [1, 2, 3])
    np.testing.assert_allclose(
        flat[3:33].reshape(6, 5), (U * np.array([8.0, 4, 2, 2, 2])) @ V.T, atol=1e-5
    )
    np.testing.assert_array_equal(flat[33:], [1, 0, 0, 0])
    srb.apply_srb(flat, man, 0.5, ["v"])  # rank-1 2x2: tail raised to sigma_1
    np.testing.assert_allclose(flat[33:], [1, 0, 0, 1], atol=1e-6)


# ============================================================================== fedepth.py

A4 = np.array(
    [[0.0, 1.0, 5.0, 9.0], [1.0, 0.0, 1.0, 9.0], [5.0, 1.0, 0.0, 1.0], [9.0, 9.0, 1.0, 0.0]]
)


@pytest.mark.parametrize(
    "A,message",
    [
        (np.zeros((2, 3)), r"divergence matrix must be square and non-empty, got shape \(2, 3\)"),
        (np.zeros((0, 0)), r"got shape \(0, 0\)"),
        (np.zeros(3), r"got shape \(3,\)"),
        (np.array([[0.0, np.nan], [1.0, 0.0]]), "divergence matrix must be finite and >= 0"),
        (np.array([[0.0, -1.0], [1.0, 0.0]]), "finite and >= 0"),
    ],
)
def test_fedepth_refuses_bad_divergence_matrices(A, message):
    for call in (
        lambda: fd.threshold_membership(A, 1.0),
        lambda: fd.hard_clusters(A, 1.0),
        lambda: fd.calibrate_tau(A),
        lambda: fd.overlap_sweep(A),
    ):
        with pytest.raises(ValueError, match=message):
            call()


def test_threshold_membership_includes_the_boundary_and_each_client_itself():
    M = fd.threshold_membership(A4, 1.0)
    assert M.dtype == bool
    np.testing.assert_array_equal(M, [[1, 1, 0, 0], [1, 1, 1, 0], [0, 1, 1, 1], [0, 0, 1, 1]])
    A = np.array([[2.0, 0.5], [0.5, 2.0]])  # a diagonal above tau still keeps i in its own row
    np.testing.assert_array_equal(fd.threshold_membership(A, 0.4), np.eye(2, dtype=bool))
    for bad in (-0.5, float("nan"), float("inf")):
        with pytest.raises(ValueError, match=f"tau must be finite and >= 0, got {bad!r}"):
            fd.threshold_membership(A4, bad)
    np.testing.assert_array_equal(fd.threshold_membership(A4, 0.0), np.eye(4, dtype=bool))


def test_merge_subsets_keeps_the_inclusion_maximal_rows_ordered_by_members():
    M = np.array(
        [
            [0, 0, 1, 1, 0],
            [1, 1, 0, 0, 0],
            [0, 0, 0, 0, 0],  # empty row: dropped
            [0, 0, 0, 1, 0],  # subset of {2,3}
            [1, 1, 0, 0, 0],
        ]
    )  # duplicate
    assert fd._as_clusters(fd.merge_subsets(M)) == [(0, 1), (2, 3)]
    out = fd.merge_subsets(np.zeros((2, 3)))
    assert out.shape == (0, 3) and out.dtype == bool
    with pytest.raises(ValueError, match=r"membership matrix must be 2-D, got shape \(3,\)"):
        fd.merge_subsets(np.ones(3))
    # equal-size overlapping rows are both kept
    assert fd._as_clusters(fd.merge_subsets(np.array([[1, 1, 0], [0, 1, 1]]))) == [(0, 1), (1, 2)]


@settings(derandomize=True, max_examples=30, deadline=None)
@given(st.integers(0, 10_000), st.integers(2, 8), st.floats(0.0, 3.0))
def test_soft_clusters_cover_every_client_with_no_cluster_inside_another(seed, K, tau):
    rng = np.random.default_rng(seed)
    m = rng.normal(size=(K, 2))
    A = fd.jeffreys_matrix(m, np.ones_like(m))
    clusters = fd.soft_clusters(A, tau)
    assert set().union(*map(set, clusters)) == set(range(K))
    sets = [set(c) for c in clusters]
    assert all(
        not (a < b) and (a != b or i == j) for i, a in enumerate(sets) for j, b in enumerate(sets)
    )
    # every cluster is the neighbourhood of one of its members (a row of M)
    M = fd.threshold_membership(A, tau)
    rows = {tuple(np.flatnonzero(r)) for r in M}
    assert all(c in rows for c in clusters)
    assert clusters == sorted(clusters)
    # a client's clusters: memberships is the inverse map
    mem = fd.memberships(clusters, K)
    assert all(i in clusters[k] for i in range(K) for k in mem[i]) and all(mem)


def test_hard_clusters_cut_average_linkage_at_tau():
    assert fd.hard_clusters(np.zeros((1, 1)), 0.0) == [(0,)]
    assert fd.hard_clusters(A4, 1.0) == [(0, 1), (2, 3)]
    assert fd.hard_clusters(A4, 0.5) == [(0,), (1,), (2,), (3,)]
    assert fd.hard_clusters(A4, 100.0) == [(0, 1, 2, 3)]
    # asymmetric input is read as (A + A^T)/2; the diagonal is ignored
    A = A4.copy()
    A[0, 1], A[1, 0] = 0.0, 2.0
    A[3, 3] = 4.0
    assert fd.hard_clusters(A, 1.0) == [(0, 1), (2, 3)]
    # average linkage: {0,1} to {2,3} is (5+9+1+9)/4 = 6 (single linkage would join at 1)
    assert fd.hard_clusters(A4, 5.9) == [(0, 1), (2, 3)]
    assert fd.hard_clusters(A4, 6.0) == [(0, 1, 2, 3)]


def test_overlap_ratio_conventions():
    assert fd.overlap_ratio([(0, 1, 2)], 3) == 1.0
    assert fd.overlap_ratio([(0,)], 1) == 0.0  # one client alone is not "everyone shared"
    assert fd.overlap_ratio([(0, 1)], 3) == 0.0
    assert fd.overlap_ratio([], 0) == 0.0
    assert fd.overlap_ratio([(0, 1, 2), (2, 3), (3, 0)], 4) == 0.75


def test_candidate_taus_are_the_distinct_divergences_or_a_quantile_grid_of_them():
    assert fd._candidate_taus(A4, 256).tolist() == [0.0, 1.0, 5.0, 9.0]
    assert fd._candidate_taus(A4, 2).tolist() == [0.0, 9.0]
    assert fd._candidate_taus(A4, 3).tolist() == [0.0, 5.0, 9.0]
    assert fd._candidate_taus(A4, 4).tolist() == [0.0, 1.0, 5.0, 9.0]
    for bad in (1, 2.5, "3"):
        with pytest.raises(ValueError, match=f"max_candidates must be an int >= 2, got {bad!r}"):
            fd._candidate_taus(A4, bad)


def test_overlap_sweep_soft_and_hard():
    taus, ovs, ns = fd.overlap_sweep(A4)
    assert taus.tolist() == [0.0, 1.0, 5.0, 9.0]
    assert ovs.tolist() == [0.0, 0.5, 1.0, 1.0] and ns.tolist() == [4, 2, 1, 1]
    taus, ovs, ns = fd.overlap_sweep(A4, hard=True)
    assert ovs.tolist() == [0.0, 0.0, 0.0, 1.0] and ns.tolist() == [4, 2, 2, 1]
    taus, ovs, ns = fd.overlap_sweep(A4, max_candidates=2)
    assert taus.tolist() == [0.0, 9.0] and ns.tolist() == [4, 1]


def test_calibrate_tau_soft_hard_and_the_unreachable_fallback():
    assert fd.calibrate_tau(A4) == (0.0, 0.0)  # 20%: only singletons stay under it
    assert fd.calibrate_tau(A4, 0.5) == (1.0, 0.5)
    assert fd.calibrate_tau(A4, 0.2, hard=True) == (5.0, 0.0)
    assert fd.calibrate_tau(A4, 1.0) == (9.0, 1.0)
    assert fd.calibrate_tau(A4, 0.5, max_candidates=2) == (0.0, 0.0)
    for bad in (-0.1, 1.1):
        with pytest.raises(ValueError, match=f"target_overlap must be in \\[0, 1\\], got {bad!r}"):
            fd.calibrate_tau(A4, bad)
    # identical descriptors chain 0-1-2 at A = 0: even tau = 0 gives one cluster (100%)
    A = np.array([[0.0, 0.0, 5.0], [0.0, 0.0, 0.0], [5.0, 0.0, 0.0]])
    assert fd.calibrate_tau(A, 0.5) == (0.0, 1.0)
    assert fd.calibrate_tau(A, 0.5, hard=True) == (0.0, 0.0)  # average linkage keeps 2 apart
    assert fd.calibrate_tau(np.zeros((3, 3)), 0.5, hard=True) == (0.0, 1.0)


def test_routing_an_unseen_robot_to_the_nearest_clusters():
    clusters = [(0, 1, 2), (1, 2, 3)]
    a = np.array([0.5, 1.5, 4.0, 8.0])
    np.testing.assert_allclose(fd.route_scores(a, clusters), [2.0, 4.5])
    assert fd.route_clusters(a, clusters, 2.0) == [0]  # S_k == tau is within
    assert fd.route_clusters(a, clusters, 4.5) == [0, 1]
    assert fd.route_clusters(a, clusters, 1.9) == [0]  # none within: argmin
    assert fd.route_clusters(np.array([9.0, 9.0, 1.0, 1.0]), clusters, 0.5) == [1]
    with pytest.raises(ValueError, match="no clusters to route to"):
        fd.route_clusters(a, [], 1.0)


def test_jeffreys_to_each_checks_the_descriptor_dimension():
    m = np.array([[0.0, 0.0], [1.0, 2.0]])
    v = np.ones((2, 2))
    np.testing.assert_allclose(fd.jeffreys_to_each([0.0, 0.0], [1.0, 1.0], m, v), [0.0, 5.0])
    # per dim 1/2 ((2 + d^2)/1 + (1 + d^2)/2) - 1: d = 0 -> 0.25; d = 1 -> 1; d = 2 -> 3.25
    np.testing.assert_allclose(fd.jeffreys_to_each([0.0, 0.0], [2.0, 2.0], m, v), [0.5, 4.25])
    for mu, var, means, message in (
        ([0.0], [1.0], m, r"descriptor dimension 1 does not match the clustered ones \(2,\)"),
        ([0.0, 0.0], [1.0], m, "descriptor dimension 2"),
        ([0.0, 0.0], [1.0, 1.0], np.zeros(2), "does not match"),
    ):
        with pytest.raises(ValueError, match=message):
            fd.jeffreys_to_each(mu, var, means, v if np.ndim(means) == 2 else np.ones(2))


# ================================================================================== rnd.py

IDS4 = ["a", "b", "c", "d"]
N4 = np.array(
    [[1.0, 1.1, 3.0, 3.0], [1.2, 1.0, 3.0, 3.0], [3.0, 1.5, 1.0, 1.05], [3.0, 3.0, 1.1, 1.0]]
)


def _scores(N, ids=IDS4):
    return {
        r: {p: float(N[i, j]) for j, p in enumerate(ids) if not np.isnan(N[i, j])}
        for i, r in enumerate(ids)
    }


def test_novelty_matrix_rows_are_the_evaluating_robot_and_missing_scores_are_nan():
    scores = _scores(N4)
    del scores["a"]["d"]
    scores["b"]["stranger"] = 0.1  # a peer outside the round is ignored
    N = rnd.novelty_matrix(IDS4, scores)
    assert np.isnan(N[0, 3]) and N[1, 0] == 1.2 and N[2, 1] == 1.5
    np.testing.assert_array_equal(
        np.nan_to_num(N, nan=-1),
        np.where(np.arange(4) == 3, -1, N4) * np.array([[1], [0], [0], [0]])
        + N4 * np.array([[0], [1], [1], [1]]),
    )


@pytest.mark.parametrize(
    "edit,message",
    [
        (lambda s: s.pop("c"), "no novelty scores from robot 'c'"),
        (
            lambda s: s["b"].update(c=-0.5),
            r"novelty score s\['b'\]\['c'\] = -0.5 must be finite and >= 0",
        ),
        (lambda s: s["d"].update(a=float("nan")), r"s\['d'\]\['a'\] = nan"),
        (lambda s: s["a"].update(x=float("inf")), r"s\['a'\]\['x'\] = inf"),
        (lambda s: s["d"].pop("d"), "robot 'd' did not report its self-novelty s_ii"),
    ],
)
def test_novelty_matrix_refuses_bad_reports_naming_robot_and_peer(edit, message):
    scores = _scores(N4)
    edit(scores)
    with pytest.raises(ValueError, match=message):
        rnd.novelty_matrix(IDS4, scores)


def test_compatibility_is_s_ij_within_eps_sigma_of_s_ii_boundary_included():
    sigma = np.array([0.2, 0.3, 0.5, 0.2])
    C = rnd.compatibility(N4, sigma, 1.0)  # thresholds 1.2, 1.3, 1.5, 1.2 (c->b exactly 1.5)
    np.testing.assert_array_equal(C, [[1, 1, 0, 0], [1, 1, 0, 0], [0, 1, 1, 1], [0, 0, 1, 1]])
    C = rnd.compatibility(N4, sigma, 0.5)  # thresholds 1.1, 1.15, 1.25, 1.1
    np.testing.assert_array_equal(C, [[1, 1, 0, 0], [0, 1, 0, 0], [0, 0, 1, 1], [0, 0, 1, 1]])
    N = N4.copy()
    N[0, 1] = np.nan
    N[3, 3] = 5.0  # s_ii above everything: all peers look familiar
    C = rnd.compatibility(N, sigma, 1.0)
    assert not C[0, 1] and C[3].all()
    N[1, 1] = 9.0
    np.fill_diagonal(N, [1.0, 9.0, 1.0, 1.0])
    assert rnd.compatibility(N, np.zeros(4), 0.0).diagonal().all()


@pytest.mark.parametrize(
    "N,sigma,eps,message",
    [
        (np.ones((2, 3)), np.ones(2), 1.0, r"novelty matrix must be square, got shape \(2, 3\)"),
        (np.ones(2), np.ones(2), 1.0, r"got shape \(2,\)"),
        (np.ones((2, 2)), np.ones(3), 1.0, r"sigma has shape \(3,\), expected \(2,\)"),
        (np.ones((2, 2)), np.array([0.1, np.nan]), 1.0, "sigma_1 = nan must be finite and >= 0"),
        (np.ones((2, 2)), np.array([np.inf, 0.1]), 1.0, "sigma_0 = inf"),
        (np.ones((2, 2)), np.ones(2), -1.0, "eps must be finite and >= 0, got -1.0"),
        (np.ones((2, 2)), np.ones(2), float("nan"), "got nan"),
        (
            np.array([[1.0, 1.0], [1.0, np.nan]]),
            np.ones(2),
            1.0,
            "self-novelty s_ii missing for index 1",
        ),
    ],
)
def test_compatibility_refuses_bad_inputs_naming_them(N, sigma, eps, message):
    with pytest.raises(ValueError, match=message):
        rnd.compatibility(N, sigma, eps)


def test_symmetrise_and_federations():
    C = np.array([[1, 1, 0], [0, 1, 0], [0, 1, 1]], dtype=bool)
    np.testing.assert_array_equal(rnd.symmetrise(C), np.eye(3, dtype=bool))
    np.testing.assert_array_equal(rnd.symmetrise(C, "either"), [[1, 1, 0], [1, 1, 1], [0, 1, 1]])
    with pytest.raises(ValueError, match=r"symmetrise mode 'both' not in \('mutual', 'either'\)"):
        rnd.symmetrise(C, "both")
    assert rnd.federations(np.eye(3)) == [[0], [1], [2]]
    adj = np.zeros((5, 5), dtype=bool)
    adj[4, 1] = adj[1, 4] = adj[0, 3] = adj[3, 0] = True
    assert rnd.federations(adj) == [[0, 3], [1, 4], [2]]


def test_rnd_federations_from_reports_mutual_and_either():
    sigma = dict(zip(IDS4, [0.2, 0.3, 0.5, 0.2]))
    groups, N = rnd.rnd_federations(IDS4, _scores(N4), sigma, 1.0)
    assert groups == [["a", "b"], ["c", "d"]]
    np.testing.assert_array_equal(N, N4)
    groups, _ = rnd.rnd_federations(IDS4, _scores(N4), sigma, 1.0, mode="either")
    assert groups == [["a", "b", "c", "d"]]
    groups, _ = rnd.rnd_federations(IDS4, _scores(N4), sigma, 0.0)
    assert groups == [["a"], ["b"], ["c"], ["d"]]


@settings(derandomize=True, max_examples=25, deadline=None)
@given(st.integers(0, 10_000), st.floats(0.0, 3.0))
def test_rnd_federations_are_invariant_to_robot_order(seed, eps):
    rng = np.random.default_rng(seed)
    ids = [f"r{i}" for i in range(5)]
    N = rng.uniform(0.5, 2.0, size=(5, 5))
    sigma = dict(zip(ids, rng.uniform(0.0, 0.5, size=5)))
    groups, _ = rnd.rnd_federations(ids, _scores(N, ids), sigma, eps)
    perm = [ids[i] for i in rng.permutation(5)]
    again, _ = rnd.rnd_federations(perm, _scores(N, ids), sigma, eps)
    assert sorted(map(sorted, groups)) == sorted(map(sorted, again))


# ============================================================================ strategies/*

INIT = {
    "temporal.w": np.array([[1.0, 0.0], [0.0, 1.0]], np.float32),
    "temporal.b": np.array([0.5, -0.5], np.float32),
    "head.w": np.array([[2.0, 1.0], [0.0, -1.0]], np.float32),
}
MAN = manifest_of(INIT)
TH0 = flatten(INIT)


def _sd(vec):
    return unflatten(np.asarray(vec, np.float32), MAN, copy=True)


def _up(rid, vec, n=1, round_idx=0, cluster_id=-1):
    return ClientUpdate(rid, _sd(vec), n, round_idx, cluster_id)


def _strategy(name, ids, **kw):
    s = make_strategy(name, **kw)
    s.initialize({k: v.copy() for k, v in INIT.items()}, list(ids))
    return s


def _flat(sd):
    return flatten({k: np.asarray(sd[k], np.float32) for k in INIT})


def _vec(temporal=(0, 0, 0, 0, 0, 0), head=(0, 0, 0, 0)):
    """theta^0 plus an update: 6 temporal values (w then b) and 4 head values."""
    return TH0 + np.array(list(temporal) + list(head), np.float32)


# ----------------------------------------------------------------------- fedavg / fedprox


def test_fedavg_strategy_is_the_sample_weighted_mean_into_cluster_zero():
    s = _strategy("fedavg", "abc")
    res = s.aggregate_round(0, [_up("c", TH0 + 4, 3), _up("a", TH0, 1)], {})
    np.testing.assert_allclose(_flat(res.cluster_models[0]), TH0 + 3, rtol=1e-6)
    assert list(res.cluster_models) == [0]
    assert res.assignments == {r: [(0, 1.0)] for r in "abc"}
    assert res.diagnostics == {
        "round": 0,
        "robots": ["a", "c"],
        "num_samples": [1.0, 3.0],
        "prox_mu": 0.0,
        "strategy": "fedavg",
        "robust": "mean",
    }


def test_fedprox_is_fedavg_on_the_server_and_tells_robots_its_mu():
    s = _strategy("fedprox", "ab", mu=0.25)
    assert s.mu == 0.25 and s.round_config(3).prox_mu == 0.25
    res = s.aggregate_round(0, [_up("a", TH0 + 2, 1), _up("b", TH0, 1)], {})
    np.testing.assert_allclose(_flat(res.cluster_models[0]), TH0 + 1, rtol=1e-6)
    assert res.diagnostics["prox_mu"] == 0.25 and res.diagnostics["strategy"] == "fedprox"
    assert make_strategy("fedprox").mu == 1e-3 and make_strategy("fedprox", mu=0).mu == 0.0
    for bad in (-1e-3, float("nan"), float("inf")):
        with pytest.raises(ValueError, match=f"FedProx mu must be finite and >= 0, got {bad!r}"):
            make_strategy("fedprox", mu=bad)


# ------------------------------------------------------------------------------ feddrman


@pytest.mark.parametrize(
    "kw,message",
    [
        ({"num_clusters": 0}, "num_clusters must be an int >= 1, got 0"),
        ({"num_clusters": 2.0}, "num_clusters must be an int >= 1, got 2.0"),
        ({"beta": -0.1}, r"beta must be in \[0, 1\], got -0.1"),
        ({"beta": 1.1}, "got 1.1"),
        ({"beta": "0.9"}, "got '0.9'"),
        ({"cua_method": "greedy"}, r"cua_method 'greedy' not in \('auto', 'exact', 'scalable'\)"),
        ({"singleton_intra": float("nan")}, "singleton_intra must be finite, got nan"),
        ({"lambda_sub": -1.0}, "lambda_sub"),
    ],
)
def test_feddrman_refuses_bad_settings_naming_them(kw, message):
    with pytest.raises(ValueError, match=message):
        make_strategy("feddrman", **kw)


def test_feddrman_defaults_follow_the_paper():
    s = make_strategy("feddrman")
    assert (s.num_clusters, s.beta, s.use_cua, s.use_srb) == (1, 0.9, True, True)
    assert (
        s.omega_prefixes == ("temporal.",) and s.cua_method == "auto" and s.singleton_intra == 0.0
    )
    assert (s.srb_prefixes, s.srb_min_dim, s.srb_exclude, s.seed) == (None, 2, (), 0)
    cfg = s.round_config(0)
    assert (cfg.use_sub, cfg.use_act, cfg.lambda_sub, cfg.lambda_act) == (True, True, 0.03, 0.005)
    t = make_strategy(
        "feddrman",
        num_clusters=np.int64(3),
        beta=1,
        omega_prefixes="head.",
        srb_prefixes=["x"],
        srb_exclude=["y"],
        seed=7,
        use_cua=0,
        use_srb=0,
        singleton_intra=1,
    )
    assert (
        t.num_clusters == 3
        and type(t.num_clusters) is int
        and t.beta == 1.0
        and type(t.beta) is float
    )
    assert t.omega_prefixes == ("head.",) and t.srb_prefixes == ("x",) and t.srb_exclude == ("y",)
    assert t.use_cua is False and t.use_srb is False and t.seed == 7 and t.singleton_intra == 1.0
    assert t.effective_clusters == 1 and s.effective_clusters == 1
    assert make_strategy("feddrman", num_clusters=3).effective_clusters == 3
    assert make_strategy("feddrman", srb_prefixes=[]).srb_prefixes is None


def _drman_updates(round_idx=0):
    # temporal updates: a, b along +e1 and c, d along +e2; head updates: a, c vs b, d (larger)
    return [
        _up("a", _vec((1, 0, 0, 0, 0, 0), (9, 0, 0, 0)), 1, round_idx),
        _up("b", _vec((1, 0.1, 0, 0, 0, 0), (-9, 0, 0, 0)), 3, round_idx),
        _up("c", _vec((0, 0, 0, 1, 0, 0), (9, 0.5, 0, 0)), 2, round_idx),
        _up("d", _vec((0, 0, 0.1, 1, 0, 0), (-9, 0, 0, 0)), 2, round_idx),
    ]


def _groups_by_members(res):
    """{first member: (cluster id, members)}: cluster ids of two groups that both overlap the
    one previous cluster equally are up to the Hungarian matching (see
    docs/mutation/clustering.md)."""
    return {g[0]: (int(c), g) for c, g in res.diagnostics["groups"].items()}


def test_feddrman_partitions_on_the_omega_block_only():
    s = _strategy("feddrman", "abcd", num_clusters=2, use_srb=False)
    res = s.aggregate_round(0, _drman_updates(), {})
    g = _groups_by_members(res)
    assert sorted(v[1] for v in g.values()) == [["a", "b"], ["c", "d"]]
    ab, cd = g["a"][0], g["c"][0]
    assert {ab, cd} == {0, 1} and sorted(res.cluster_models) == [0, 1]
    assert (
        _same_partition(res.diagnostics["partition"], [0, 0, 1, 1])
        and res.diagnostics["cua_method"] == "exact"
    )
    assert res.diagnostics["omega"] == ["temporal."] and res.diagnostics["num_clusters"] == 2
    S = np.array(res.diagnostics["similarity"])
    assert S[0, 1] == pytest.approx(round(1 / math.sqrt(1.01), 6)) and S[0, 2] == 0.0
    assert res.diagnostics["objective"] == pytest.approx(
        cua.cua_objective(S, [0, 0, 1, 1]), abs=1e-5
    )
    # per-cluster FedAvg with n_k / sum n_j (no SRB): a:1, b:3 and c:2, d:2
    np.testing.assert_allclose(
        _flat(res.cluster_models[ab]),
        _vec((1, 0.075, 0, 0, 0, 0), (-4.5, 0, 0, 0)),
        rtol=1e-6,
        atol=1e-6,
    )
    np.testing.assert_allclose(
        _flat(res.cluster_models[cd]),
        _vec((0, 0, 0.05, 1, 0, 0), (0, 0.25, 0, 0)),
        rtol=1e-6,
        atol=1e-6,
    )
    assert res.assignments == {
        "a": [(ab, 1.0)],
        "b": [(ab, 1.0)],
        "c": [(cd, 1.0)],
        "d": [(cd, 1.0)],
    }
    assert res.diagnostics["srb"] == {} and res.diagnostics["use_srb"] is False
    # the next round keeps each group's id and model lineage
    res1 = s.aggregate_round(1, _drman_updates(1), {})
    assert res1.diagnostics["groups"] == res.diagnostics["groups"]
    # Omega = the head instead: the large head updates decide the split
    h = _strategy("feddrman", "abcd", num_clusters=2, use_srb=False, omega_prefixes=("head.",))
    hg = _groups_by_members(h.aggregate_round(0, _drman_updates(), {}))
    assert sorted(v[1] for v in hg.values()) == [["a", "c"], ["b", "d"]]


def test_feddrman_singleton_intra_and_scalable_method_reach_the_partition():
    s = _strategy("feddrman", "abcd", num_clusters=2, use_srb=False, cua_method="scalable", seed=3)
    res = s.aggregate_round(0, _drman_updates(), {})
    assert res.diagnostics["cua_method"] == "scalable"
    assert _same_partition(res.diagnostics["partition"], [0, 0, 1, 1])
    # C = 3 of 4 robots: two singletons, each credited singleton_intra in the objective
    for intra in (0.0, 1.0):
        t = _strategy("feddrman", "abcd", num_clusters=3, use_srb=False, singleton_intra=intra)
        res = t.aggregate_round(0, _drman_updates(), {})
        S = np.array(res.diagnostics["similarity"])
        vals = [cua.cua_objective(S, p, 3, intra) for p in cua.enumerate_partitions(4, 3)]
        assert res.diagnostics["objective"] == pytest.approx(max(vals), abs=1e-5)
        assert res.diagnostics["objective"] == pytest.approx(
            cua.cua_objective(S, res.diagnostics["partition"], 3, intra), abs=1e-5
        )


def test_feddrman_srb_rebalances_the_cluster_update_and_models_persist():
    s = _strategy("feddrman", "abcd", num_clusters=2, beta=0.5, srb_prefixes=("temporal.",))
    res = s.aggregate_round(0, _drman_updates(), {})
    plain = _strategy("feddrman", "abcd", num_clusters=2, use_srb=False).aggregate_round(
        0, _drman_updates(), {}
    )
    for cid in (0, 1):
        avg = _flat(plain.cluster_models[cid])
        delta = avg - TH0
        w_new, info = srb.srb_block(delta[:4].reshape(2, 2), 0.5)
        expected = avg.copy()
        expected[:4] = TH0[:4] + w_new.ravel()
        np.testing.assert_allclose(_flat(res.cluster_models[cid]), expected, rtol=1e-5, atol=1e-6)
        assert res.diagnostics["srb"][str(cid)] == {"temporal.w": info.to_json()}
    assert res.diagnostics["beta"] == 0.5 and res.diagnostics["use_srb"] is True
    # round 1: Delta_s is taken from the cluster's own model theta_s, not from theta^0
    theta = {c: _flat(res.cluster_models[c]) for c in (0, 1)}
    res1 = s.aggregate_round(1, _drman_updates(1), {})
    plain1 = _strategy("feddrman", "abcd", num_clusters=2, use_srb=False).aggregate_round(
        0, _drman_updates(), {}
    )
    for cid in (0, 1):
        avg = _flat(plain1.cluster_models[cid])
        delta = avg - theta[cid]
        expected = avg.copy()
        expected[:4] = theta[cid][:4] + srb.srb_block(delta[:4].reshape(2, 2), 0.5)[0].ravel()
        np.testing.assert_allclose(_flat(res1.cluster_models[cid]), expected, rtol=1e-5, atol=1e-5)


def test_feddrman_srb_block_selection_settings_reach_the_rebalancing():
    for kw in (
        {"srb_min_dim": 3},
        {"srb_exclude": ("temporal.", "head.")},
        {"srb_prefixes": ("nothing.",)},
    ):
        s = _strategy("feddrman", "abcd", num_clusters=2, beta=0.5, **kw)
        res = s.aggregate_round(0, _drman_updates(), {})
        assert res.diagnostics["srb"] == {}, kw
    s = _strategy("feddrman", "abcd", num_clusters=2, beta=0.5, srb_exclude=("temporal.",))
    assert list(s.aggregate_round(0, _drman_updates(), {}).diagnostics["srb"]["0"]) == ["head.w"]


@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")
def test_feddrman_ablation_and_errors():
    s = _strategy("feddrman", "abcd", num_clusters=2, use_cua=False, use_srb=False)
    res = s.aggregate_round(0, _drman_updates(), {})
    assert list(res.cluster_models) == [0] and res.diagnostics["num_clusters"] == 1
    assert "similarity" not in res.diagnostics and res.diagnostics["use_cua"] is False
    np.testing.assert_allclose(
        _flat(res.cluster_models[0]),
        (
            _vec((1, 0, 0, 0, 0, 0), (9, 0, 0, 0)) * 1
            + _vec((1, 0.1, 0, 0, 0, 0), (-9, 0, 0, 0)) * 3
            + _vec((0, 0, 0, 1, 0, 0), (9, 0.5, 0, 0)) * 2
            + _vec((0, 0, 0.1, 1, 0, 0), (-9, 0, 0, 0)) * 2
        )
        / 8,
        rtol=1e-5,
        atol=1e-6,
    )
    t = _strategy("feddrman", "abcd", num_clusters=3)
    with pytest.raises(ValueError, match="FedDRMan round 4: K=2 updates < num_clusters C=3"):
        t.aggregate_round(4, _drman_updates(4)[:2], {})
    ups = _drman_updates()
    ups[2].params["temporal.w"][0, 0] = np.inf
    with pytest.raises(ValueError, match="update of 'c' holds NaN/Inf values"):
        t.aggregate_round(0, ups, {})


def test_feddrman_state_names_its_settings_and_restores_omega():
    s = _strategy("feddrman", "abcd", num_clusters=2, beta=0.5, omega_prefixes=("temporal.",))
    s.aggregate_round(0, _drman_updates(), {})
    arrays, meta = s.state()
    assert meta["extra"] == {
        "num_clusters": 2,
        "beta": 0.5,
        "use_cua": True,
        "use_srb": True,
        "omega_prefixes": ["temporal."],
        "buffer_regroup_every": 4,
    }
    t = make_strategy("feddrman", num_clusters=2, beta=0.5)
    t.load_state(arrays, meta)
    a = s.aggregate_round(1, _drman_updates(1), {})
    b = t.aggregate_round(1, _drman_updates(1), {})
    assert a.diagnostics["groups"] == b.diagnostics["groups"]
    for cid in a.cluster_models:
        np.testing.assert_array_equal(_flat(a.cluster_models[cid]), _flat(b.cluster_models[cid]))


# ------------------------------------------------------------------------------- fedepth

# 1-D descriptors, variance 1: Jeffreys divergence = (m_i - m_j)^2
MEANS = {"a": 0.0, "b": 1.0, "c": 3.0, "d": 4.0}  # A = [[0,1,9,16],[1,0,4,9],[9,4,0,1],[16,9,1,0]]


def _gauss(rid, mean, var=1.0):
    return ClientDescriptor(rid, "gaussian", mean=np.array([mean]), variance=np.array([var]))


def _descs(means=MEANS):
    return {r: _gauss(r, m) for r, m in means.items()}


def _depth_updates(round_idx=0, ids="abcd"):
    return [_up(r, TH0 + k, k + 1, round_idx) for k, r in enumerate("abcd") if r in ids]


@pytest.mark.parametrize(
    "kw,message",
    [
        ({"tau": -1.0}, "tau must be finite and >= 0, got -1.0"),
        ({"tau": float("inf")}, "got inf"),
        ({"target_overlap": 1.5}, r"target_overlap must be in \[0, 1\], got 1.5"),
        ({"target_overlap": -0.5}, "got -0.5"),
        ({"recluster_every": -1}, "recluster_every must be an int >= 0, got -1"),
        ({"recluster_every": 2.0}, "got 2.0"),
    ],
)
def test_fedepth_refuses_bad_settings(kw, message):
    with pytest.raises(ValueError, match=message):
        make_strategy("fedepth", **kw)


def test_fedepth_defaults():
    s = make_strategy("fedepth", tau=0)
    assert s.tau == 0 and s.tau_setting == 0
    s = make_strategy("fedepth")
    assert (s.tau, s.target_overlap, s.hard, s.recluster_every) == (None, 0.2, False, 0)
    assert make_strategy("fedepth", hard=1, target_overlap=1).hard is True


def test_fedepth_calibrated_soft_clusters_and_multi_membership():
    s = _strategy("fedepth", "abcd", target_overlap=0.5)
    res = s.aggregate_round(0, _depth_updates(), _descs())
    d = res.diagnostics
    assert d["tau"] == 4.0 and s.tau == 4.0 and d["overlap"] == 0.5
    assert d["clusters"] == {"0": ["a", "b", "c"], "1": ["b", "c", "d"]}
    assert d["jeffreys"] == [[0, 1, 9, 16], [1, 0, 4, 9], [9, 4, 0, 1], [16, 9, 1, 0]]
    assert (
        d["updated_clusters"] == [0, 1] and d["round"] == 0 and d["robots"] == ["a", "b", "c", "d"]
    )
    # w_k = sum n_c / sum n_j w_c: a, b, c have n = 1, 2, 3 (updates +0, +1, +2); b, c, d: 2, 3, 4
    np.testing.assert_allclose(_flat(res.cluster_models[0]), TH0 + 8 / 6, rtol=1e-6)
    np.testing.assert_allclose(_flat(res.cluster_models[1]), TH0 + 20 / 9, rtol=1e-6)
    assert res.assignments == {
        "a": [(0, 1.0)],
        "b": [(0, 0.5), (1, 0.5)],
        "c": [(0, 0.5), (1, 0.5)],
        "d": [(1, 1.0)],
    }
    np.testing.assert_allclose(_flat(s.model_for("b")), TH0 + (8 / 6 + 20 / 9) / 2, rtol=1e-6)
    # default 20%: only the disjoint pairs stay under it
    t = _strategy("fedepth", "abcd")
    assert t.aggregate_round(0, _depth_updates(), _descs()).diagnostics["clusters"] == {
        "0": ["a", "b"],
        "1": ["c", "d"],
    }


def test_fedepth_given_tau_and_hard_mode():
    s = _strategy("fedepth", "abcd", tau=4.0, hard=True)
    res = s.aggregate_round(0, _depth_updates(), _descs())
    # average linkage at 4: {a,b} and {c,d} (they are 8.75 apart on average)
    assert (
        res.diagnostics["clusters"] == {"0": ["a", "b"], "1": ["c", "d"]}
        and res.diagnostics["overlap"] == 0.0
    )
    assert all(len(m) == 1 for m in res.assignments.values())
    soft = _strategy("fedepth", "abcd", tau=4.0, target_overlap=0.0)
    assert soft.aggregate_round(0, _depth_updates(), _descs()).diagnostics["clusters"] == {
        "0": ["a", "b", "c"],
        "1": ["b", "c", "d"],
    }


def test_fedepth_routes_unseen_robots_to_clusters_within_tau_or_the_nearest():
    s = _strategy("fedepth", "abcd", tau=4.0)
    assert s.route(_gauss("new", 2.0)) == [(0, 1.0)]  # no descriptors yet: the base router
    s.aggregate_round(0, _depth_updates(), _descs())
    # to a..d: 4, 1, 1, 4 -> S = 2 and 2: both within tau, equal weights
    assert s.route(_gauss("new", 2.0)) == [(0, 0.5), (1, 0.5)]
    # 12.25, 6.25, .25, .25 -> S = 6.25, 2.25: only cluster 1
    assert s.route(_gauss("new", 3.5)) == [(1, 1.0)]
    # far away: none within tau -> the nearest
    assert s.route(_gauss("new", -20.0)) == [(0, 1.0)]
    assert s.route(_gauss("new", 30.0)) == [(1, 1.0)]
    # a robot without a gaussian descriptor goes to the cluster with most members
    s2 = _strategy("fedepth", "abcd", tau=1.0)
    s2.aggregate_round(
        0,
        _depth_updates(),
        {
            **_descs(),
        },
    )
    s2._assign["d"] = [(0, 1.0)]
    assert s2.route(ClientDescriptor("new", "update")) == [(0, 1.0)]
    # a robot first seen in configure_round has no descriptor: largest cluster (3 vs 3: lowest id)
    assert s.configure_round(1, ["e"])["e"].membership == [(0, 1.0)]


def test_fedepth_needs_descriptors_until_clustered_then_every_recluster_rounds():
    s = _strategy("fedepth", "abcd", tau=1.0, recluster_every=2)
    assert s.needs_descriptors(0) == {"gaussian"} and s.needs_descriptors(5) == {"gaussian"}
    s.aggregate_round(1, _depth_updates(1), _descs())
    assert [s.needs_descriptors(r) for r in (1, 2, 3, 4)] == [
        set(),
        set(),
        {"gaussian"},
        {"gaussian"},
    ]
    s.aggregate_round(2, _depth_updates(2), {})  # not due: no descriptors needed
    once = _strategy("fedepth", "abcd", tau=1.0)
    once.aggregate_round(0, _depth_updates(), _descs())
    assert once.needs_descriptors(1000) == set()


def test_fedepth_refuses_missing_or_mismatched_descriptors():
    s = _strategy("fedepth", "abcd", tau=1.0)
    d = _descs()
    del d["c"]
    with pytest.raises(
        ValueError, match="FeDepth needs a gaussian descriptor from every robot; missing for 'c'"
    ):
        s.aggregate_round(0, _depth_updates(), d)
    d = _descs()
    d["b"] = ClientDescriptor("b", "rnd", scores={"b": 1.0}, residual_std=0.1)
    with pytest.raises(ValueError, match="missing for 'b'"):
        s.aggregate_round(0, _depth_updates(), d)
    with pytest.raises(ValueError, match="missing for 'a'"):
        s.aggregate_round(0, _depth_updates(), None)
    d = _descs()
    d["d"] = ClientDescriptor("d", "gaussian", mean=np.zeros(2), variance=np.ones(2))
    with pytest.raises(
        ValueError, match=r"gaussian descriptors have different dimensions \[\(1,\), \(2,\)\]"
    ):
        s.aggregate_round(0, _depth_updates(), d)


def test_fedepth_reclustering_keeps_ids_drops_old_clusters_and_reroutes_absent_robots():
    s = _strategy("fedepth", "abcd", tau=4.0, recluster_every=1)
    s.aggregate_round(0, _depth_updates(), _descs())
    assert s.cluster_ids() == [0, 1]
    # round 1: only a, b, c report; now everyone is close together except... c moved next to a
    res = s.aggregate_round(
        1,
        _depth_updates(1, "abc"),
        {r: _gauss(r, m) for r, m in {"a": 0.0, "b": 1.0, "c": 0.5}.items()},
    )
    assert res.diagnostics["clusters"] == {"0": ["a", "b", "c"]}
    assert s.cluster_ids() == [0]
    # d pointed at the dropped cluster 1: moved to a live one
    assert res.assignments["d"] == [(0, 1.0)]
    np.testing.assert_allclose(_flat(res.cluster_models[0]), TH0 + 8 / 6, rtol=1e-6)


def test_fedepth_round_without_clustered_robots_is_refused():
    s = _strategy("fedepth", "abcd", tau=1.0)
    s.aggregate_round(0, _depth_updates(), _descs())
    with pytest.raises(ValueError, match="FeDepth round 1: no update comes from a clustered robot"):
        s.aggregate_round(1, [_up("zed", TH0, 1, 1)], {})
    # a cluster without updates this round keeps its model
    before = _flat(s.cluster_models()[1])
    res = s.aggregate_round(1, _depth_updates(1, "ab"), {})
    assert res.diagnostics["updated_clusters"] == [0]
    np.testing.assert_array_equal(_flat(res.cluster_models[1]), before)


def test_fedepth_state_round_trip_keeps_tau_clusters_and_descriptors():
    s = _strategy("fedepth", "abcd", target_overlap=0.5, recluster_every=3)
    s.aggregate_round(2, _depth_updates(2), _descs())
    arrays, meta = s.state()
    assert meta["extra"] == {
        "tau": 4.0,
        "clusters": {"0": ["a", "b", "c"], "1": ["b", "c", "d"]},
        "desc_ids": ["a", "b", "c", "d"],
        "clustered_round": 2,
    }
    np.testing.assert_array_equal(arrays["desc_mean"], [[0.0], [1.0], [3.0], [4.0]])
    np.testing.assert_array_equal(arrays["desc_var"], np.ones((4, 1)))
    t = make_strategy("fedepth", recluster_every=3)
    t.load_state(arrays, meta)
    assert t.tau == 4.0 and t._clusters == {0: ["a", "b", "c"], 1: ["b", "c", "d"]}
    assert [t.needs_descriptors(r) for r in (4, 5)] == [set(), {"gaussian"}]
    assert t.route(_gauss("new", 3.5)) == [(1, 1.0)]
    fresh = _strategy("fedepth", "ab")
    arrays, meta = fresh.state()
    assert "desc_mean" not in arrays and meta["extra"]["clustered_round"] == -1
    u = make_strategy("fedepth")
    u.load_state(arrays, {**meta, "extra": {}})
    assert u.tau is None and u._clusters == {} and u._desc_mean is None and u._desc_var is None
    assert u.needs_descriptors(0) == {"gaussian"} and u._desc_ids == []
    assert u.state()[1]["extra"]["clustered_round"] == -1 and u.state()[1]["extra"]["tau"] is None


# ----------------------------------------------------------------------------------- ifca


def test_ifca_select_picks_the_first_smallest_loss():
    assert ifca_select([0.3, 0.1, 0.1]) == 1 and ifca_select((x for x in [2.0])) == 0
    assert ifca_select([-1.0, 0.0]) == 0
    with pytest.raises(ValueError, match="ifca_select: need at least one loss"):
        ifca_select([])
    with pytest.raises(ValueError, match="need at least one loss"):
        ifca_select([[1.0, 2.0]])
    with pytest.raises(ValueError, match=r"ifca_select: non-finite loss in \[0.1, inf\]"):
        ifca_select([0.1, float("inf")])


@pytest.mark.parametrize(
    "kw,message",
    [
        ({"num_clusters": 0}, "num_clusters must be an int >= 1, got 0"),
        ({"num_clusters": "2"}, "got '2'"),
        ({"init_noise": -0.1}, "init_noise must be finite and >= 0, got -0.1"),
        ({"init_noise": float("nan")}, "got nan"),
    ],
)
def test_ifca_refuses_bad_settings(kw, message):
    with pytest.raises(ValueError, match=message):
        make_strategy("ifca", **kw)


def test_ifca_starts_from_theta0_plus_seeded_relative_noise_per_tensor():
    init = {
        "flat": np.zeros(4000, np.float32),
        "wide": (100 * np.random.default_rng(0).normal(size=4000)).astype(np.float32),
    }
    s = make_strategy("ifca")
    assert (s.num_clusters, s.init_noise, s.seed) == (2, 0.01, 0)
    s = make_strategy("ifca", num_clusters=3, init_noise=0.05, seed=4)
    s.initialize(init, ["a"])
    models = s.cluster_models()
    assert sorted(models) == [0, 1, 2]
    np.testing.assert_array_equal(models[0]["flat"], init["flat"])
    for c in (1, 2):
        # constant tensor (std 0): absolute noise 0.05; wide tensor: 0.05 x its std
        assert np.std(models[c]["flat"]) == pytest.approx(0.05, rel=0.1)
        assert np.std(models[c]["wide"] - init["wide"]) == pytest.approx(
            0.05 * np.std(init["wide"]), rel=0.1
        )
    assert not np.array_equal(models[1]["flat"], models[2]["flat"])
    again = make_strategy("ifca", num_clusters=3, init_noise=0.05, seed=4)
    again.initialize(init, ["a"])
    np.testing.assert_array_equal(again.cluster_models()[2]["wide"], models[2]["wide"])
    other = make_strategy("ifca", num_clusters=3, init_noise=0.05, seed=5)
    other.initialize(init, ["a"])
    assert not np.array_equal(other.cluster_models()[1]["flat"], models[1]["flat"])
    quiet = make_strategy("ifca", num_clusters=2, init_noise=0.0)
    quiet.initialize(init, ["a"])
    np.testing.assert_array_equal(quiet.cluster_models()[1]["wide"], init["wide"])


def test_ifca_memberships_and_per_choice_averages():
    s = _strategy("ifca", "abc", num_clusters=3)
    assert s.client_selects_cluster and s.round_config(0).pick_cluster
    assert s.configure_round(0, ["a", "zz"])["zz"].membership == [(0, 1.0), (1, 0.0), (2, 0.0)]
    assert s.route(ClientDescriptor("q", "update")) == [(0, 1.0), (1, 0.0), (2, 0.0)]
    before = s.cluster_models()
    res = s.aggregate_round(
        0, [_up("a", TH0 + 1, 1, 0, 2), _up("b", TH0 + 5, 3, 0, 2), _up("c", TH0, 1, 0, 0)], {}
    )
    np.testing.assert_allclose(_flat(res.cluster_models[2]), TH0 + 4, rtol=1e-6)
    np.testing.assert_array_equal(_flat(res.cluster_models[0]), TH0)
    np.testing.assert_array_equal(_flat(res.cluster_models[1]), _flat(before[1]))
    assert res.assignments["a"] == [(0, 0.0), (1, 0.0), (2, 1.0)]
    assert res.diagnostics == {
        "round": 0,
        "robots": ["a", "b", "c"],
        "choices": {"a": 2, "b": 2, "c": 0},
        "updated_clusters": [0, 2],
        "client_selects_cluster": True,
        "strategy": "ifca",
        "robust": "mean",
    }
    for bad in (3, -1):
        with pytest.raises(
            ValueError, match=f"IFCA update of 'b' reports cluster_id {bad}, expected 0..2"
        ):
            s.aggregate_round(1, [_up("a", TH0, 1, 1, 0), _up("b", TH0, 1, 1, bad)], {})


# ---------------------------------------------------------------------------------- local


def test_local_gives_every_robot_its_own_model_and_new_robots_fresh_ids():
    s = _strategy("local", ["a", "b"])
    assert s.cluster_ids() == [0, 1] and s.configure_round(0, ["a", "b"])["b"].membership == [
        (1, 1.0)
    ]
    assert s.configure_round(0, ["c"])["c"].membership == [(2, 1.0)]
    np.testing.assert_array_equal(_flat(s.model_for("c")), TH0)
    res = s.aggregate_round(0, [_up("b", TH0 + 2), _up("d", TH0 + 3)], {})
    assert res.assignments["d"] == [(3, 1.0)]
    np.testing.assert_array_equal(_flat(res.cluster_models[1]), TH0 + 2)
    np.testing.assert_array_equal(_flat(res.cluster_models[3]), TH0 + 3)
    np.testing.assert_array_equal(_flat(res.cluster_models[0]), TH0)
    assert res.diagnostics == {
        "round": 0,
        "robots": ["b", "d"],
        "strategy": "local",
        "robust": "mean",
    }
    bad = TH0.copy()
    bad[-1] = np.nan
    with pytest.raises(ValueError, match="update of 'a' holds NaN/Inf values"):
        s.aggregate_round(1, [_up("a", bad, 1, 1)], {})
    empty = _strategy("local", [])
    assert empty.cluster_ids() == [] and empty.configure_round(0, ["x"])["x"].membership == [
        (0, 1.0)
    ]


# ------------------------------------------------------------------------------------ rnd


def _rnd_descs(N=N4, sigma=(0.2, 0.3, 0.5, 0.2), ids=IDS4):
    return {
        r: ClientDescriptor(
            r,
            "rnd",
            scores={p: float(N[i, j]) for j, p in enumerate(ids)},
            residual_std=float(sigma[i]),
        )
        for i, r in enumerate(ids)
    }


def _rnd_updates(round_idx=0, ids=IDS4):
    return [_up(r, TH0 + k, k + 1, round_idx) for k, r in enumerate(IDS4) if r in ids]


@pytest.mark.parametrize(
    "kw,message",
    [
        ({"eps": -1.0}, "eps must be finite and >= 0, got -1.0"),
        ({"eps": float("inf")}, "got inf"),
        ({"recluster_every": -2}, "recluster_every must be an int >= 0, got -2"),
        ({"recluster_every": 1.0}, "got 1.0"),
        ({"symmetrise": "any"}, r"symmetrise 'any' not in \('mutual', 'either'\)"),
    ],
)
def test_rnd_strategy_refuses_bad_settings(kw, message):
    with pytest.raises(ValueError, match=message):
        make_strategy("rnd", **kw)


def test_rnd_strategy_federations_and_per_federation_fedavg():
    s = make_strategy("rnd")
    assert (s.eps, s.recluster_every, s.symmetrise, s.descriptor_kind) == (1.0, 0, "mutual", "rnd")
    s = _strategy("rnd", IDS4)
    desc = _rnd_descs()
    del desc["a"].scores["d"]  # missing score: incompatible, shown as -1
    res = s.aggregate_round(0, _rnd_updates(), desc)
    d = res.diagnostics
    assert d["federations"] == {"0": ["a", "b"], "1": ["c", "d"]} and d["eps"] == 1.0
    assert d["novelty"][0] == [1.0, 1.1, 3.0, -1.0] and d["novelty"][2] == [3.0, 1.5, 1.0, 1.05]
    assert d["updated_clusters"] == [0, 1]
    # n = 1, 2 for a, b (updates +0, +1); 3, 4 for c, d (+2, +3)
    np.testing.assert_allclose(_flat(res.cluster_models[0]), TH0 + 2 / 3, rtol=1e-6)
    np.testing.assert_allclose(_flat(res.cluster_models[1]), TH0 + 18 / 7, rtol=1e-6)
    assert res.assignments == {"a": [(0, 1.0)], "b": [(0, 1.0)], "c": [(1, 1.0)], "d": [(1, 1.0)]}
    either = _strategy("rnd", IDS4, symmetrise="either")
    assert either.aggregate_round(0, _rnd_updates(), _rnd_descs()).diagnostics["federations"] == {
        "0": ["a", "b", "c", "d"]
    }
    tight = _strategy("rnd", IDS4, eps=0.5)  # thresholds 1.1 1.15 1.25 1.1: b->a 1.2 fails
    # c, d hold two of cluster 0's robots: they keep id 0, a and b get fresh ids
    assert tight.aggregate_round(0, _rnd_updates(), _rnd_descs()).diagnostics["federations"] == {
        "0": ["c", "d"],
        "1": ["a"],
        "2": ["b"],
    }


def test_rnd_strategy_refuses_missing_descriptors_and_reclusters_on_schedule():
    s = _strategy("rnd", IDS4, recluster_every=2)
    d = _rnd_descs()
    d["c"] = _gauss("c", 0.0)
    with pytest.raises(
        ValueError, match="RND needs an rnd descriptor from every robot; missing for 'c'"
    ):
        s.aggregate_round(0, _rnd_updates(), d)
    with pytest.raises(ValueError, match="missing for 'a'"):
        s.aggregate_round(0, _rnd_updates(), None)
    assert s.needs_descriptors(0) == {"rnd"}
    s.aggregate_round(1, _rnd_updates(1), _rnd_descs())
    assert [s.needs_descriptors(r) for r in (2, 3, 4)] == [set(), {"rnd"}, {"rnd"}]
    once = _strategy("rnd", IDS4)
    once.aggregate_round(0, _rnd_updates(), _rnd_descs())
    assert once.needs_descriptors(50) == set()
    assert once.state()[1]["extra"] == {"clustered_round": 0, "eps": 1.0}
    t = make_strategy("rnd")
    t.load_state(*once.state())
    assert t.needs_descriptors(1) == set() and t._clustered_round == 0
    u = make_strategy("rnd")
    arrays, meta = once.state()
    u.load_state(arrays, {**meta, "extra": {}})
    assert u.needs_descriptors(1) == {"rnd"}
    assert u.state()[1]["extra"]["clustered_round"] == -1


def test_rnd_strategy_reclustering_keeps_ids_and_routes_unknown_and_absent_robots():
    s = _strategy("rnd", IDS4, recluster_every=1)
    s.aggregate_round(0, _rnd_updates(), _rnd_descs())
    # an update from a robot never clustered joins the federation with most robots (ties: lowest id)
    N = np.array([[1.0, 1.1, 1.1], [1.1, 1.0, 1.1], [1.1, 1.1, 1.0]])
    res = s.aggregate_round(
        1, _rnd_updates(1, "abc"), _rnd_descs(N, (0.2, 0.2, 0.2), ["a", "b", "c"])
    )
    assert res.diagnostics["federations"] == {"0": ["a", "b", "c"]}
    assert s.cluster_ids() == [0]
    assert res.assignments["d"] == [(0, 1.0)]  # its federation 1 is gone
    np.testing.assert_allclose(_flat(res.cluster_models[0]), TH0 + 8 / 6, rtol=1e-6)
    late = _strategy("rnd", IDS4[:2])
    late.aggregate_round(0, _rnd_updates(0, "ab"), _rnd_descs(N4[:2, :2], (0.2, 0.3), ["a", "b"]))
    res = late.aggregate_round(1, _rnd_updates(1, "ab") + [_up("zed", TH0 + 7, 2, 1)], {})
    assert res.assignments["zed"] == [(0, 1.0)]
    np.testing.assert_allclose(_flat(res.cluster_models[0]), _flat(late.cluster_models()[0]))
    np.testing.assert_allclose(_flat(res.cluster_models[0]), TH0 + (0 + 2 + 14) / 5, rtol=1e-6)


# ------------------------------------------------------- messages, references and edge cases


@pytest.mark.parametrize(
    "call,message",
    [
        (lambda: agg.fedavg([], []), r"^fedavg: no updates$"),
        (lambda: agg.sample_weights([]), r"^sample_weights: need at least one sample count$"),
        (
            lambda: agg.jeffreys_matrix(np.array([[np.nan]]), np.ones((1, 1))),
            r"^jeffreys_matrix: descriptors hold NaN/Inf$",
        ),
        (
            lambda: fd.threshold_membership(np.array([[0.0, -1.0], [1.0, 0.0]]), 1.0),
            r"^divergence matrix must be finite and >= 0$",
        ),
        (lambda: fd.route_clusters(np.zeros(2), [], 1.0), r"^no clusters to route to$"),
        (lambda: ifca_select([]), r"^ifca_select: need at least one loss$"),
        (
            lambda: agg.update_similarity(
                np.array([[np.nan, 0], [0, 0]], np.float32), slice(0, 2), np.zeros(2, np.float32)
            ),
            r"^update 0 holds NaN/Inf values$",
        ),
    ],
)
@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")
def test_error_messages_are_exactly_the_documented_ones(call, message):
    with pytest.raises(ValueError, match=message):
        call()


def test_fedavg_overflow_message_is_exact(monkeypatch):
    monkeypatch.setattr(
        agg, "weighted_average", lambda stacked, w: np.full(stacked.shape[1], np.inf, np.float32)
    )
    with pytest.raises(ValueError, match=r"^fedavg overflowed to Inf$"):
        agg.fedavg([_sd2([1, 2], 3)], [1])


def test_weighted_rows_with_one_client_and_several_clusters():
    out = np.full((2, 3), -1.0, np.float32)
    agg.weighted_rows(np.array([[2, 4, 6]], np.float32), np.array([[1.0], [0.5]]), out=out)
    np.testing.assert_array_equal(out, [[2, 4, 6], [1, 2, 3]])


def test_repair_moves_the_member_with_the_lowest_mean_attachment_from_groups_of_two_or_more():
    S = np.zeros((5, 5))
    S[0, 1] = S[1, 0] = S[0, 2] = S[2, 0] = 0.3
    S[1, 2] = S[2, 1] = 0.9
    S[3, 4] = S[4, 3] = 0.4
    # mean attachments: 0 -> 0.3, 1 and 2 -> 0.6, 3 and 4 -> 0.4 (sums would pick 3 instead)
    assert cua._repair(np.array([0, 0, 0, 1, 1]), S, 3).tolist() == [2, 0, 0, 1, 1]
    # two groups of two: a pair may give up a member
    out = cua._repair(np.array([0, 0, 1, 1]), S[:4, :4], 3)
    assert sorted(np.bincount(out, minlength=3).tolist()) == [1, 1, 2]


def test_merge_subsets_reads_any_nonzero_entry_as_membership():
    assert fd._as_clusters(fd.merge_subsets(np.array([[2, 0, 0], [1, 1, 0]]))) == [(0, 1)]
    assert fd.merge_subsets(np.array([[2, 0], [0, 3]])).dtype == bool


def test_overlap_ratio_of_two_clients_in_one_cluster_is_full_overlap():
    assert fd.overlap_ratio([(0, 1)], 2) == 1.0
    assert fd.overlap_sweep(A4)[2].dtype.kind == "i"


def test_calibrate_tau_fallback_reports_the_overlap_at_tau_zero():
    # zero divergences chain 0-1-2-3: tau = 0 already gives {0,1,2} {1,2,3} (50%); A_02 = 1 joins
    # all
    A = np.array(
        [[0.0, 0.0, 1.0, 2.0], [0.0, 0.0, 0.0, 2.0], [1.0, 0.0, 0.0, 0.0], [2.0, 2.0, 0.0, 0.0]]
    )
    assert fd.soft_clusters(A, 0.0) == [(0, 1, 2), (1, 2, 3)]
    assert fd.calibrate_tau(A, 0.4) == (0.0, 0.5)


def test_compatibility_names_the_first_bad_sigma_and_accepts_zero():
    with pytest.raises(ValueError, match="sigma_1 = -1.0"):
        rnd.compatibility(np.ones((2, 2)), np.array([0.0, -1.0]), 1.0)
    N = rnd.novelty_matrix(["a", "b"], {"a": {"a": 0.0, "b": 0.0}, "b": {"b": 0.0}})
    assert N[0, 1] == 0.0 and np.isnan(N[1, 0])


@pytest.mark.parametrize(
    "name,kw",
    [
        ("fedavg", {}),
        ("feddrman", {"num_clusters": 2, "use_srb": False}),
        ("fedepth", {"tau": 1.0}),
        ("rnd", {}),
        ("ifca", {"num_clusters": 2}),
    ],
)
def test_clip_rule_clips_around_each_clusters_own_model(name, kw):
    # clip_norm 0: every update is clipped to nothing, so each cluster keeps its reference model
    s = _strategy(name, IDS4, robust="clip", robust_kwargs={"clip_norm": 0.0}, **kw)
    before = {c: _flat(m) for c, m in s.cluster_models().items()}
    ups = _rnd_updates()
    for k, u in enumerate(ups):
        u.cluster_id = k % 2
    desc = {"fedepth": {r: _gauss(r, MEANS[r]) for r in IDS4}, "rnd": _rnd_descs()}.get(name, {})
    res = s.aggregate_round(0, ups, desc)
    for c, m in res.cluster_models.items():
        np.testing.assert_array_equal(_flat(m), before.get(c, TH0))


def test_diagnostics_name_the_round_and_robots_for_every_clustered_strategy():
    for name, kw, desc in (
        ("feddrman", {"num_clusters": 2}, {}),
        ("rnd", {}, _rnd_descs()),
        ("fedepth", {"tau": 1.0}, {r: _gauss(r, MEANS[r]) for r in IDS4}),
    ):
        res = _strategy(name, IDS4, **kw).aggregate_round(3, _rnd_updates(3), desc)
        assert res.diagnostics["round"] == 3 and res.diagnostics["robots"] == IDS4, name
        if name == "fedepth":
            assert res.diagnostics["tau"] == 1.0


@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")
def test_feddrman_accepts_as_many_robots_as_clusters_and_names_the_first_bad_robot():
    s = _strategy("feddrman", "abcd", num_clusters=4, use_srb=False)
    res = s.aggregate_round(0, _drman_updates(), {})
    assert sorted(len(g) for g in res.diagnostics["groups"].values()) == [1, 1, 1, 1]
    ups = _drman_updates()
    ups[0].params["temporal.w"][0, 0] = np.nan
    t = _strategy("feddrman", "abcd", num_clusters=2)
    with pytest.raises(ValueError, match=r"^update of 'a' holds NaN/Inf values$"):
        t.aggregate_round(0, ups, {})


def test_feddrman_omega_fallback_warning_is_the_documented_text_and_covers_all_columns():
    with pytest.warns(RuntimeWarning) as rec:
        s = _strategy(
            "feddrman", "abcd", num_clusters=2, use_srb=False, omega_prefixes=("nothing.",)
        )
    assert str(rec[0].message) == (
        "FedDRMan: no tensor matches omega_prefixes ['nothing.']; "
        "CUA falls back to ALL parameters for update similarity"
    )
    assert s._omega == slice(0, TH0.size) and s._omega_all is True
    res = s.aggregate_round(0, _drman_updates(), {})
    assert res.diagnostics["omega"] == "all"
    g = _groups_by_members(res)  # the large head updates dominate
    assert sorted(v[1] for v in g.values()) == [["a", "c"], ["b", "d"]]
    t = _strategy("feddrman", "abcd", num_clusters=2)
    assert t._omega_all is False and t._omega == slice(0, 6)
    assert t.aggregate_round(0, _drman_updates(), {}).diagnostics["omega"] == ["temporal."]


def test_enumerate_partitions_of_two_clients_and_the_exact_nan_message():
    assert cua.enumerate_partitions(2, 2).tolist() == [[0, 1]]
    assert cua.enumerate_partitions(2, 1).tolist() == [[0, 0]]
    with pytest.raises(ValueError, match=r"^similarity matrix holds NaN/Inf$"):
        cua.cua_partition(np.array([[1.0, np.nan], [np.nan, 1.0]]), 1)


# ================================================= float32 inputs, short vectors, bool relations


def test_cosine_of_vectors_shorter_than_one_is_still_normalised():
    V = np.array([[0.3, 0.4], [0.4, 0.3], [0.0, 0.0], [-0.03, -0.04]])
    S = agg.cosine_similarity_matrix(V)
    assert S == pytest.approx(
        np.array(
            [
                [1.0, 0.96, 0.0, -1.0],
                [0.96, 1.0, 0.0, -0.96],
                [0.0, 0.0, 1.0, 0.0],
                [-1.0, -0.96, 0.0, 1.0],
            ]
        ),
        abs=1e-12,
    )
    assert agg.gram_to_cosine(V @ V.T) == pytest.approx(S, abs=1e-12)


def test_divergences_of_float32_descriptors_are_evaluated_in_float64():
    # Descriptors arrive as float32; their divergences are those of the float64 values they hold
    # (no float32 rounding in the log-ratio and the sums).
    rng = np.random.default_rng(7)
    m32 = (rng.normal(size=(5, 6)) * 3).astype(np.float32)
    v32 = rng.uniform(0.01, 2.0, size=(5, 6)).astype(np.float32)
    m64, v64 = m32.astype(np.float64), v32.astype(np.float64)
    J32 = agg.jeffreys_matrix(m32, v32)
    assert J32.dtype == np.float64
    np.testing.assert_allclose(J32, agg.jeffreys_matrix(m64, v64), rtol=1e-13, atol=0)
    np.testing.assert_allclose(
        agg.jeffreys_matrix(m32, v64), agg.jeffreys_matrix(m64, v64), rtol=1e-13, atol=0
    )
    np.testing.assert_allclose(
        agg.jeffreys_matrix(m64, v32), agg.jeffreys_matrix(m64, v64), rtol=1e-13, atol=0
    )
    for i, j in ((0, 1), (2, 4), (3, 0)):
        kl32 = agg.kl_diag_gaussian(m32[i], v32[i], m32[j], v32[j])
        kl64 = agg.kl_diag_gaussian(m64[i], v64[i], m64[j], v64[j])
        assert kl32 == pytest.approx(kl64, rel=1e-13, abs=0)
        assert agg.jeffreys_diag(m32[i], v32[i], m32[j], v32[j]) == pytest.approx(
            J32[i, j], rel=1e-12
        )


def test_weighted_model_is_float32_whatever_the_cluster_models_dtype():
    # cluster models as float64 / int64 arrays (e.g. a BatchNorm step counter): the robot's
    # starting model is float32, for one cluster and for a weighted mix.
    models = {
        0: {"w": np.array([1.0, 2.0]), "n": np.array([4], dtype=np.int64)},
        1: {"w": np.array([3.0, 6.0]), "n": np.array([8], dtype=np.int64)},
    }
    one = agg.weighted_model(models, [(1, 1.0), (0, 0.0)])
    assert {k: v.dtype for k, v in one.items()} == {"w": np.float32, "n": np.float32}
    assert one["w"].tolist() == [3.0, 6.0] and one["n"].tolist() == [8.0]
    mix = agg.weighted_model(models, [(0, 0.75), (1, 0.25)])
    assert {k: v.dtype for k, v in mix.items()} == {"w": np.float32, "n": np.float32}
    assert mix["w"].tolist() == [1.5, 3.0] and mix["n"].tolist() == [5.0]


def test_compatibility_threshold_is_computed_in_float64_for_float32_sigma():
    # s_01 sits exactly on the float64 threshold s_00 + eps * sigma_0 (boundary included); with
    # the threshold rounded to float32 it would fall just outside.
    eps = 3.0
    sigma32 = np.float32(0.7)
    thr = 0.0 + eps * float(sigma32)
    assert float((eps * np.array([sigma32]))[0]) < thr  # float32 rounding lands below
    N = np.array([[0.0, thr], [thr, 0.0]])
    sigma = np.array([sigma32, sigma32], dtype=np.float32)
    C = rnd.compatibility(N, sigma, eps)
    assert C.dtype == bool and C.tolist() == [[True, True], [True, True]]
    assert rnd.compatibility(N, [float(sigma32)] * 2, eps).tolist() == C.tolist()


def test_symmetrise_treats_any_nonzero_entry_as_related():
    C = np.array([[1.0, 0.0, 1.0], [1.0, 1.0, 0.0], [1.0, 0.0, 1.0]])
    mutual = rnd.symmetrise(C)
    assert mutual.dtype == bool
    assert mutual.tolist() == [[True, False, True], [False, True, False], [True, False, True]]
    counts = np.array([[3, 2, 0], [1, 3, 0], [0, 0, 3]])  # e.g. agreement counts
    assert rnd.symmetrise(counts).tolist() == [
        [True, True, False],
        [True, True, False],
        [False, False, True],
    ]
    assert rnd.symmetrise(counts, "either").tolist() == rnd.symmetrise(counts).tolist()
    assert rnd.federations(rnd.symmetrise(counts)) == [[0, 1], [2]]
