"""Hand-computed checks of CUA, SRB, FeDepth soft clustering and RND federations."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fed_ros.core.clustering import fedepth as fd
from fed_ros.core.clustering import rnd
from fed_ros.core.strategies.aggregate import cosine_similarity_matrix
from fed_ros.core.clustering.cua import (
    cua_exact,
    cua_objective,
    cua_partition,
    cua_scalable,
    enumerate_partitions,
    stirling2,
)
from fed_ros.core.clustering.srb import rebalanced_singular_values, srb_block, threshold_index

# --------------------------------------------------------------------------------- CUA


def test_cua_objective_of_given_partition_by_hand():
    S = np.array(
        [[1.0, 0.9, 0.1, 0.2], [0.9, 1.0, 0.3, 0.0], [0.1, 0.3, 1.0, 0.8], [0.2, 0.0, 0.8, 1.0]]
    )
    # Groups {0,1} {2,3}: intra means 0.9 and 0.8; inter mean (0.1+0.2+0.3+0.0)/4 = 0.15.
    assert cua_objective(S, [0, 0, 1, 1]) == pytest.approx(0.5 * (0.9 + 0.8) - 0.15)
    # Groups {0} {1,2,3}: singleton intra 0 (documented default), intra (0.3+0.0+0.8)/3, inter
    # (0.9+0.1+0.2)/3.
    assert cua_objective(S, [0, 1, 1, 1]) == pytest.approx(0.5 * (1.1 / 3) - 1.2 / 3)
    assert cua_objective(S, [0, 1, 1, 1], singleton_intra=1.0) == pytest.approx(
        0.5 * (1.0 + 1.1 / 3) - 1.2 / 3
    )
    # Three groups: binom(3,2) = 3 inter means.
    val = cua_objective(S, [0, 0, 1, 2], singleton_intra=1.0)
    assert val == pytest.approx(
        (0.9 + 1.0 + 1.0) / 3 - ((0.1 + 0.3) / 2 + (0.2 + 0.0) / 2 + 0.8) / 3
    )
    assert cua_exact(S, 2).labels.tolist() == [0, 0, 1, 1]


def test_partition_enumeration_counts_are_stirling_numbers():
    assert [stirling2(12, c) for c in (1, 2, 3, 4)] == [1, 2047, 86526, 611501]
    parts = enumerate_partitions(7, 3)
    assert parts.shape == (stirling2(7, 3), 7)
    assert len({tuple(p) for p in parts}) == parts.shape[0]
    assert all(len(set(p)) == 3 for p in parts.tolist())


def test_cua_rejects_k_below_c_and_bad_matrices():
    with pytest.raises(ValueError, match="K=2.*C=3"):
        cua_partition(np.eye(2), 3)
    S = np.eye(3)
    S[0, 1] = np.nan
    with pytest.raises(ValueError, match="NaN"):
        cua_partition(S, 2)
    with pytest.raises(ValueError, match="empty"):
        cua_objective(np.eye(3), [0, 0, 2], C=3)


def _separated(seed: int, K: int, C: int, noise: float = 0.2) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    centers = rng.normal(size=(C, 40))
    # Every planted group has >= 2 members (a lone robot has no intra pair; see cua.py).
    labels = np.concatenate([np.arange(C), np.arange(C), rng.integers(0, C, size=K - 2 * C)])
    V = centers[labels] + noise * rng.normal(size=(K, 40))
    return cosine_similarity_matrix(V), labels


@settings(max_examples=12, deadline=None)
@given(seed=st.integers(0, 10_000), K=st.integers(6, 10), C=st.integers(2, 3))
def test_exact_and_scalable_cua_agree_on_well_separated_clusters(seed, K, C):
    S, truth = _separated(seed, K, C)
    exact = cua_exact(S, C)
    fast = cua_scalable(S, C, seed=seed)
    assert fast.objective == pytest.approx(exact.objective, abs=1e-9)
    same = lambda a, b: len({(x, y) for x, y in zip(a, b)}) == C  # same partition up to renaming
    assert same(fast.labels, exact.labels) and same(exact.labels, truth)


@settings(max_examples=10, deadline=None)
@given(seed=st.integers(0, 10_000))
def test_cua_permutation_invariant(seed):
    S, _ = _separated(seed, 8, 2, noise=1.0)
    perm = np.random.default_rng(seed).permutation(8)
    a = cua_exact(S, 2)
    b = cua_exact(S[np.ix_(perm, perm)], 2)
    assert a.objective == pytest.approx(b.objective, abs=1e-12)


def test_scalable_cua_recovers_large_separated_fleet():
    S, truth = _separated(1, 150, 3)
    res = cua_partition(S, 3)
    assert res.method == "scalable"
    assert len({(x, y) for x, y in zip(res.labels, truth)}) == 3


@pytest.mark.parametrize("K,C", [(150, 3), (400, 2)])
def test_the_lanczos_spectral_start_decides_as_the_full_eigendecomposition(monkeypatch, K, C):
    import fed_ros.core.clustering.cua as cua

    S, truth = _separated(2, K, C)
    S = S + np.random.default_rng(3).normal(0, 0.15, S.shape)  # noisy: the starts matter more
    S = np.clip((S + S.T) / 2, -1, 1)
    np.fill_diagonal(S, 1.0)
    lanczos, start = cua_partition(S, C), cua._spectral_start(S, C, 0)
    monkeypatch.setattr(cua, "LANCZOS_MIN_K", 10**9)
    full, full_start = cua_partition(S, C), cua._spectral_start(S, C, 0)
    # The same spectral start (labels up to renaming), and through it the same result.
    assert len({(x, y) for x, y in zip(start, full_start)}) == C
    assert len({(x, y) for x, y in zip(start, truth)}) == C
    assert lanczos.objective == pytest.approx(full.objective, abs=1e-12)
    assert len({(x, y) for x, y in zip(lanczos.labels, full.labels)}) == C


# --------------------------------------------------------------------------------- SRB


def _matrix_with_singular_values(
    s: list[float], m: int = 6, n: int = 5, seed: int = 0
) -> np.ndarray:
    rng = np.random.default_rng(seed)
    U, _ = np.linalg.qr(rng.normal(size=(m, len(s))))
    V, _ = np.linalg.qr(rng.normal(size=(n, len(s))))
    return (U * np.asarray(s)) @ V.T, U, V


def test_srb_on_matrix_with_known_singular_values():
    sigma = [8.0, 4.0, 2.0, 1.0, 0.5]  # total 15.5; cumulative shares .516 .774 .903 .968 1.0
    assert threshold_index(np.array(sigma), 0.9) == 2  # c* = 3 (1-based), sigma_c* = 2
    assert threshold_index(np.array(sigma), 0.85) == 2
    assert threshold_index(np.array(sigma), 0.95) == 3
    np.testing.assert_allclose(rebalanced_singular_values(np.array(sigma), 0.9), [8, 4, 2, 2, 2])
    D, U, V = _matrix_with_singular_values(sigma)
    out, info = srb_block(D.astype(np.float32), 0.9)
    expected = (U * np.array([8.0, 4.0, 2.0, 2.0, 2.0])) @ V.T
    np.testing.assert_allclose(out, expected, atol=1e-5)
    assert info.c_star == 3 and info.sigma_c == pytest.approx(2.0, rel=1e-5) and info.raised == 2
    np.testing.assert_allclose(np.linalg.svd(out, compute_uv=False), [8, 4, 2, 2, 2], atol=1e-5)


def test_srb_raises_the_noise_tail_of_a_rank_one_update_to_sigma_1():
    # A layer fed a constant input (the bench's text encoder: one instruction) gets a
    # numerically rank-1 update. sigma_1 alone then holds >= beta of the spectrum, so c* = 1
    # and every tail direction, noise included, is raised to sigma_1: the update's norm grows
    # by sqrt(min(m, n)) (x5.66 for the bench's 32x64 text_encoder.0). This pins that
    # property of Eq. 13-14; it is not clipped.
    rng = np.random.default_rng(1)
    D = (
        rng.normal(size=(32, 1)) @ rng.normal(size=(1, 8)) + 1e-4 * rng.normal(size=(32, 8))
    ).astype(np.float32)
    out, info = srb_block(D, 0.9)
    assert info.c_star == 1 and info.raised == 7
    assert info.norm_after / info.norm_before == pytest.approx(np.sqrt(8.0), rel=1e-3)
    np.testing.assert_allclose(np.linalg.svd(out, compute_uv=False), info.sigma_c, rtol=1e-4)


def test_srb_beta_one_keeps_block_and_zero_block_untouched():
    D, _, _ = _matrix_with_singular_values([3.0, 2.0, 1.0])
    out, info = srb_block(D.astype(np.float32), 1.0)
    np.testing.assert_allclose(out, D, atol=1e-5)
    z, zinfo = srb_block(np.zeros((4, 3), np.float32), 0.9)
    assert not z.any() and zinfo.raised == 0
    with pytest.raises(ValueError, match="beta"):
        threshold_index(np.ones(3), 1.5)


# ----------------------------------------------------------------------------- FeDepth


def test_subset_merging_on_crafted_membership_matrix():
    M = np.array(
        [
            [1, 1, 0, 0, 0],  # {0,1}       subset of {0,1,2}
            [1, 1, 1, 0, 0],  # {0,1,2}
            [0, 1, 1, 1, 0],  # {1,2,3}
            [0, 0, 1, 1, 0],  # {2,3}       subset of {1,2,3}
            [0, 0, 0, 0, 1],  # {4}
            [1, 1, 1, 0, 0],
        ],  # duplicate of {0,1,2}
        dtype=bool,
    )
    merged = fd.merge_subsets(M)
    assert [tuple(np.flatnonzero(r)) for r in merged] == [(0, 1, 2), (1, 2, 3), (4,)]
    assert fd.overlap_ratio([(0, 1, 2), (1, 2, 3), (4,)], 5) == pytest.approx(2 / 5)
    assert fd.overlap_ratio([(0, 1, 2, 3, 4)], 5) == 1.0
    assert fd.overlap_ratio([(0, 1), (2, 3, 4)], 5) == 0.0


def test_soft_clusters_threshold_and_routing():
    A = np.array(
        [[0.0, 1.0, 5.0, 9.0], [1.0, 0.0, 1.0, 9.0], [5.0, 1.0, 0.0, 1.0], [9.0, 9.0, 1.0, 0.0]]
    )
    # Rows at tau=1: {0,1} {0,1,2} {1,2,3} {2,3}; the two-member rows are absorbed.
    clusters = fd.soft_clusters(A, 1.0)
    assert clusters == [(0, 1, 2), (1, 2, 3)]  # clients 1 and 2 bridge both clusters
    assert fd.hard_clusters(A, 1.0) == [(0, 1), (2, 3)]
    # Routing: S_k = mean divergence to the members of cluster k.
    a_test = np.array([0.5, 1.5, 4.0, 8.0])
    np.testing.assert_allclose(fd.route_scores(a_test, clusters), [2.0, 4.5])
    assert fd.route_clusters(a_test, clusters, tau=2.0) == [0]
    assert fd.route_clusters(a_test, clusters, tau=5.0) == [0, 1]
    assert fd.route_clusters(np.full(4, 50.0), clusters, tau=2.0) == [
        0
    ]  # none within tau -> argmin


def _blocks(sizes, within=1.0, between=50.0):
    """Divergence matrix of well-separated groups: `within` inside a group, `between` across."""
    lab = np.repeat(np.arange(len(sizes)), sizes)
    A = np.where(lab[:, None] == lab[None, :], within, between)
    np.fill_diagonal(A, 0.0)
    return A


def test_tau_calibration_two_groups_and_a_bridge_of_five():
    # {0,1} and {3,4} far apart, client 2 halfway. 20% of 5 (one bridge client) is not
    # reachable: two clusters can never share exactly one client, because the bridge's own
    # row {0..4} unites them. Old rule (closest, smaller tau on ties) gave 5 singletons.
    A = _blocks([2, 1, 2])
    A[2, :] = A[:, 2] = 5.0
    A[2, 2] = 0.0
    tau, ov = fd.calibrate_tau(A, 0.2)
    assert (tau, ov) == (1.0, 0.0)
    assert fd.soft_clusters(A, tau) == [(0, 1), (2,), (3, 4)]
    assert fd.calibrate_tau(A, 0.0) == (1.0, 0.0)  # 0%: hard, not singletons
    tau1, ov1 = fd.calibrate_tau(A, 1.0)  # 100%: one cluster ~ FedAvg
    assert ov1 == 1.0 and fd.soft_clusters(A, tau1) == [(0, 1, 2, 3, 4)]
    taus, ovs, ns = fd.overlap_sweep(A)
    np.testing.assert_array_equal(taus, [0.0, 1.0, 5.0, 50.0])
    np.testing.assert_array_equal(ovs, [0.0, 0.0, 1.0, 1.0])
    np.testing.assert_array_equal(ns, [5, 3, 1, 1])


def test_tau_calibration_two_bridge_clients_share_both_clusters():
    # A = {0..3}, B = {6..9}; 4 is close to A and to 5, 5 close to B and to 4.
    A = _blocks([4, 1, 1, 4])
    A[4, :4] = A[:4, 4] = 2.0
    A[5, 6:] = A[6:, 5] = 2.0
    A[4, 5] = A[5, 4] = 2.0
    A[4, 6:] = A[6:, 4] = 30.0
    A[5, :4] = A[:4, 5] = 30.0
    tau, ov = fd.calibrate_tau(A, 0.2)
    assert tau == 2.0 and ov == pytest.approx(0.2)
    assert fd.soft_clusters(A, tau) == [(0, 1, 2, 3, 4, 5), (4, 5, 6, 7, 8, 9)]
    # At 10% the bridges are not affordable: largest disjoint clustering instead.
    assert fd.calibrate_tau(A, 0.1) == (1.0, 0.0)
    assert fd.soft_clusters(A, 1.0) == [(0, 1, 2, 3), (4,), (5,), (6, 7, 8, 9)]


def test_tau_calibration_twenty_robots_two_groups_gives_two_clusters():
    rng = np.random.default_rng(0)
    means = np.concatenate([rng.normal(0, 0.3, (10, 4)), rng.normal(3, 0.3, (10, 4))])
    A = fd.jeffreys_matrix(means, np.ones_like(means))
    for target in (0.1, 0.2, 0.3):
        tau, ov = fd.calibrate_tau(A, target)
        clusters = fd.soft_clusters(A, tau)
        assert len(clusters) == 2 and ov <= target  # was 15 clusters at 20%
        # Each cluster holds one whole group plus its bridge robots from the other group.
        assert set(range(10)) <= set(clusters[0]) and set(range(10, 20)) <= set(clusters[1])
        assert len(set(clusters[0]) & set(clusters[1])) == round(20 * ov)
    tau0, ov0 = fd.calibrate_tau(A, 0.0)
    assert ov0 == 0.0 and fd.soft_clusters(A, tau0) == [tuple(range(10)), tuple(range(10, 20))]
    tau1, ov1 = fd.calibrate_tau(A, 1.0)
    assert ov1 == 1.0 and len(fd.soft_clusters(A, tau1)) == 1


@pytest.mark.parametrize("seed", range(4))
def test_calibrated_tau_is_largest_admissible_in_sweep(seed):
    rng = np.random.default_rng(seed)
    means = rng.normal(0, 1, (12, 3)) + 2.0 * rng.integers(0, 3, (12, 1))
    A = fd.jeffreys_matrix(means, rng.uniform(0.5, 2.0, (12, 3)))
    taus, ovs, _ = fd.overlap_sweep(A)
    for target in (0.0, 0.2, 0.5, 1.0):
        tau, ov = fd.calibrate_tau(A, target)
        assert tau == taus[ovs <= target + 1e-9].max() and ov <= target + 1e-9
    with pytest.raises(ValueError, match="target_overlap"):
        fd.calibrate_tau(A, 1.5)
    with pytest.raises(ValueError, match="max_candidates"):
        fd.calibrate_tau(A, 0.2, max_candidates=1)


# --------------------------------------------------------------------------------- RND


def test_rnd_compatibility_on_crafted_novelty_matrix():
    ids = ["a", "b", "c", "d"]
    # Rows: evaluating robot i; columns: predictor j.
    N = np.array(
        [[1.0, 1.1, 3.0, 3.0], [1.2, 1.0, 3.0, 3.0], [3.0, 1.4, 1.0, 1.05], [3.0, 3.0, 1.1, 1.0]]
    )
    sigma = np.array([0.2, 0.3, 0.5, 0.2])
    C = rnd.compatibility(N, sigma, eps=1.0)
    # thresholds s_ii + eps sigma_i = 1.2, 1.3, 1.5, 1.2
    expected = np.array([[1, 1, 0, 0], [1, 1, 0, 0], [0, 1, 1, 1], [0, 0, 1, 1]], dtype=bool)
    np.testing.assert_array_equal(C, expected)
    assert rnd.federations(rnd.symmetrise(C, "mutual")) == [[0, 1], [2, 3]]
    assert rnd.federations(rnd.symmetrise(C, "either")) == [[0, 1, 2, 3]]  # c->b link joins all
    scores = {r: {p: float(N[i, j]) for j, p in enumerate(ids)} for i, r in enumerate(ids)}
    groups, N2 = rnd.rnd_federations(ids, scores, dict(zip(ids, sigma)), eps=1.0)
    assert groups == [["a", "b"], ["c", "d"]]
    np.testing.assert_array_equal(N2, N)
    assert rnd.federations(rnd.symmetrise(rnd.compatibility(N, sigma, eps=0.0))) == [
        [0],
        [1],
        [2],
        [3],
    ]


def test_rnd_rejects_missing_self_score_and_bad_sigma():
    with pytest.raises(ValueError, match="'b'"):
        rnd.novelty_matrix(["a", "b"], {"a": {"a": 1.0}, "b": {"a": 1.0}})
    with pytest.raises(ValueError, match="sigma_1"):
        rnd.compatibility(np.ones((2, 2)), np.array([0.1, -1.0]), 1.0)
