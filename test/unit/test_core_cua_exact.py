"""CUA (FedDRMan Eq. 10-12, fed_ros/core/clustering/cua.py) exactly: the scalable heuristic's
documented defaults and seeded results, its starts (average linkage, spectral, greedy peel, batch
refine) against straightforward reference implementations of their docstrings, and the contract that
every result has exactly C non-empty groups.

The scalable solver is a deterministic function of (S, C, singleton_intra, seed, restarts,
max_moves); its seeded results on unstructured ("noise") fleets are pinned here. Those fleets
have many local optima, so the pins depend on every knob of the heuristic (restarts, kicks, their
sizes, the move budget, the seed): a changed knob is a changed result, to be re-pinned on purpose.

ROS-free, no torch; deterministic (seeded).
"""

from __future__ import annotations

import numpy as np
import pytest
from scipy.cluster.vq import kmeans2

from fed_ros.core.strategies import aggregate as agg
from fed_ros.core.clustering import cua


def _noise(seed: int, K: int, D: int = 4) -> np.ndarray:
    """Cosine similarities of K random updates in D dimensions: no real groups, many local
    optima."""
    rng = np.random.default_rng(seed)
    return agg.cosine_similarity_matrix(rng.normal(size=(K, D)))


def _S0(S: np.ndarray) -> np.ndarray:
    S0 = np.array(S, dtype=np.float64)
    np.fill_diagonal(S0, 0.0)
    return S0


def _same_partition(a, b) -> bool:
    return cua._canonical(np.asarray(a)).tolist() == cua._canonical(np.asarray(b)).tolist()


# ===================================================================== scalable CUA, pinned

# (K, C, instance) -> objective of cua_scalable(S, C) with the defaults (seed 0, 3 restarts).
# K covers each regime of the heuristic: K <= 12 (a short move budget 4K + 50; K = 10 also draws
# kicks of 1..2 clients), K <= 64 (at least 40 random restarts and 60 kicks), 64 < K <= 256
# (`restarts` random restarts, 2 kicks of K // 10 clients), K > 256 (one random restart), with
# both sides of each boundary.
PINNED = [
    (10, 3, 6, 0.7206877679593906),
    (12, 3, 0, 0.6677013341728273),
    (12, 4, 1, 0.8410182945227161),
    (30, 3, 0, 0.9377198952845283),
    (30, 4, 1, 0.9222605607528386),
    (40, 3, 0, 0.8880829183678669),
    (64, 3, 0, 0.9788850086606858),
    (64, 3, 1, 0.9474414991622692),
    (64, 4, 0, 0.9655958080714766),
    (64, 4, 1, 0.9217052530860861),
    (65, 3, 0, 0.8416297608461324),
    (65, 3, 1, 0.9517021672300761),
    (65, 4, 0, 0.8429520403941272),
    (65, 4, 1, 0.9561177539268764),
    (100, 3, 0, 0.9672403053207692),
    (100, 4, 1, 0.9431237775240673),
    (256, 3, 0, 0.9677306674977133),
    (256, 3, 1, 0.9888509765205338),
    (256, 4, 0, 0.9866283614990676),
    (256, 4, 1, 0.9762169496176556),
    (257, 3, 0, 0.9691282338754112),
    (257, 3, 1, 0.9752156962863159),
    (257, 4, 0, 0.9618354126486702),
    (257, 4, 1, 0.9292033183773867),
]


@pytest.mark.parametrize("K,C,inst,objective", PINNED)
def test_scalable_cua_seeded_results_are_pinned(K, C, inst, objective):
    S = _noise(1000 * K + inst, K)
    res = cua.cua_scalable(S, C)
    assert res.method == "scalable"
    assert res.objective == pytest.approx(objective, abs=1e-9)
    # the reported objective is the labels' true J, with exactly C non-empty canonical groups
    assert res.objective == pytest.approx(cua.cua_objective(S, res.labels, C), abs=1e-9)
    assert res.labels.tolist() == cua._canonical(res.labels).tolist()
    assert np.bincount(res.labels, minlength=C).min() >= 1 and res.labels.max() == C - 1


def test_scalable_cua_defaults_are_seed_0_and_3_restarts():
    # K = 100 (64 < K <= 256): the number of random restarts is `restarts` itself.
    S = _noise(100_004, 100)
    default = cua.cua_scalable(S, 3)
    explicit = cua.cua_scalable(S, 3, singleton_intra=0.0, seed=0, restarts=3, max_moves=None)
    assert default.labels.tolist() == explicit.labels.tolist()
    assert default.objective == explicit.objective
    # the instance has teeth: another seed or restart count lands elsewhere
    assert cua.cua_scalable(S, 3, seed=1).objective != pytest.approx(default.objective, abs=1e-9)
    assert cua.cua_scalable(S, 3, restarts=2).objective != pytest.approx(
        default.objective, abs=1e-9
    )
    assert cua.cua_scalable(S, 3, restarts=4).objective != pytest.approx(
        default.objective, abs=1e-9
    )


def test_scalable_cua_results_depend_on_the_seed_only_through_the_seed():
    S = _noise(30_000, 30)
    by_seed = {s: cua.cua_scalable(S, 4, seed=s) for s in (0, 1, 2)}
    assert len({round(r.objective, 9) for r in by_seed.values()}) == 3
    for s, r in by_seed.items():
        again = cua.cua_scalable(S, 4, seed=s)
        assert again.labels.tolist() == r.labels.tolist() and again.objective == r.objective


def test_cua_partition_defaults_are_singleton_intra_0_and_seed_0():
    S = _noise(30_005, 30)  # K = 30 > exact_max_k: the scalable solver
    auto = cua.cua_partition(S, 4)
    assert auto.method == "scalable"
    ref = cua.cua_scalable(S, 4, singleton_intra=0.0, seed=0)
    assert auto.labels.tolist() == ref.labels.tolist() and auto.objective == ref.objective
    other = cua.cua_partition(S, 4, seed=1)
    assert other.labels.tolist() == cua.cua_scalable(S, 4, seed=1).labels.tolist()
    assert other.objective != pytest.approx(auto.objective, abs=1e-9)
    # exact path: singleton_intra defaults to 0.0 (a singleton earns no intra credit)
    S5 = np.array(
        [
            [1.0, 0.9, 0.3, -0.5, -0.5],
            [0.9, 1.0, 0.3, -0.5, -0.5],
            [0.3, 0.3, 1.0, -0.1, -0.1],
            [-0.5, -0.5, -0.1, 1.0, 0.9],
            [-0.5, -0.5, -0.1, 0.9, 1.0],
        ]
    )
    zero, one = cua.cua_partition(S5, 3), cua.cua_partition(S5, 3, singleton_intra=1.0)
    assert zero.objective == pytest.approx(cua.cua_exact(S5, 3, singleton_intra=0.0).objective)
    assert zero.groups() == cua.cua_exact(S5, 3, singleton_intra=0.0).groups()
    assert zero.groups() == one.groups() == [[0, 1], [2], [3, 4]]
    assert zero.objective == pytest.approx((0.9 + 0.0 + 0.9) / 3 - (-0.5 + 0.3 - 0.1) / 3)
    assert one.objective == pytest.approx((0.9 + 1.0 + 0.9) / 3 - (-0.5 + 0.3 - 0.1) / 3)


def test_scalable_default_move_budget_lets_small_fleets_reach_the_exact_optimum():
    # K = 12: the default budget (4K + 50 moves) is ample; max_moves=0 skips the local search.
    for inst, C in ((1, 3), (3, 3)):
        S = _noise(12_000 + inst, 12)
        exact = cua.cua_exact(S, C)
        assert cua.cua_scalable(S, C).objective == pytest.approx(exact.objective, abs=1e-12)
        assert cua.cua_scalable(S, C, max_moves=None).objective == pytest.approx(
            exact.objective, abs=1e-12
        )
        assert cua.cua_scalable(S, C, max_moves=0).objective < exact.objective - 1e-3


def test_scalable_cua_with_one_cluster_has_integer_labels_and_the_singleton_objective():
    res = cua.cua_scalable(_noise(5, 6), 1)
    assert res.labels.dtype == np.int64 and res.labels.tolist() == [0] * 6
    # one robot alone: J is the intra credit of a singleton, `singleton_intra` (default 0.0)
    assert cua.cua_scalable(np.ones((1, 1)), 1).objective == 0.0
    lone = cua.cua_scalable(np.ones((1, 1)), 1, singleton_intra=0.25)
    assert lone.objective == 0.25 and lone.labels.dtype == np.int64 and lone.labels.tolist() == [0]


def test_float32_similarities_are_evaluated_in_float64():
    # a float32 (and slightly asymmetric) similarity matrix scores like its float64 copy: no
    # float32 rounding in the symmetrisation, block sums and means; for the objective, the exact
    # search and the heuristic
    S32 = (_noise(9, 9) + 1e-3 * np.random.default_rng(9).normal(size=(9, 9))).astype(np.float32)
    S64 = S32.astype(np.float64)
    labels = [0, 1, 2, 0, 1, 2, 0, 1, 2]
    assert cua.cua_objective(S32, labels, 3) == pytest.approx(
        cua.cua_objective(S64, labels, 3), rel=1e-14, abs=0
    )
    e32, e64 = cua.cua_exact(S32, 3), cua.cua_exact(S64, 3)
    assert e32.labels.tolist() == e64.labels.tolist()
    assert e32.objective == pytest.approx(e64.objective, rel=1e-14, abs=0)
    s32, s64 = cua.cua_scalable(S32, 3), cua.cua_scalable(S64, 3)
    assert s32.labels.tolist() == s64.labels.tolist()
    assert s32.objective == pytest.approx(s64.objective, rel=1e-14, abs=0)


def test_scalable_cua_never_empties_a_group_even_when_that_would_score_higher():
    # Identical updates: any two-or-more group has intra 1 and inter 1, so J = 0 for partitions
    # without singletons. Emptying a group (C-1 groups) would score higher, but C is exact.
    S = np.ones((8, 8))
    for C in (2, 3, 4):
        res = cua.cua_scalable(S, C)
        assert np.bincount(res.labels, minlength=C).min() >= 2
        assert res.objective == pytest.approx(0.0, abs=1e-12)
    labels, val = cua._local_search(
        _S0(np.ones((4, 4))), np.array([0, 0, 0, 1]), 2, 0.0, max_moves=10
    )
    assert sorted(np.bincount(labels).tolist()) == [2, 2] and val == pytest.approx(0.0, abs=1e-12)


# =================================================================== starts, by reference


def _average_linkage_reference(S: np.ndarray, C: int) -> list[int]:
    """Naive average linkage on d = 1 - S (cosine distance in [0, 2]) until C clusters remain."""
    D = np.clip(1.0 - S, 0.0, 2.0)
    clusters = [[i] for i in range(len(S))]
    while len(clusters) > C:
        best, pair = np.inf, None
        for a in range(len(clusters)):
            for b in range(a + 1, len(clusters)):
                d = D[np.ix_(clusters[a], clusters[b])].mean()
                if d < best:
                    best, pair = d, (a, b)
        a, b = pair
        clusters[a] = clusters[a] + clusters.pop(b)
    labels = np.empty(len(S), dtype=int)
    for c, members in enumerate(clusters):
        labels[members] = c
    return labels.tolist()


@pytest.mark.parametrize("seed", range(12))
def test_agglomerative_start_is_average_linkage_on_cosine_distance(seed):
    rng = np.random.default_rng(seed)
    K, C, D = int(rng.integers(5, 11)), int(rng.integers(2, 5)), int(rng.integers(2, 5))
    S = agg.cosine_similarity_matrix(rng.normal(size=(K, D)))  # positive and negative cosines
    lab = cua._agglomerative_start(S, C)
    assert sorted(set(lab.tolist())) == list(range(C))
    assert _same_partition(lab, _average_linkage_reference(S, C))


def test_agglomerative_start_averages_distances_unlike_single_linkage():
    # chain 0-1-2-3 of close neighbours plus a tight pair {4, 5}: single linkage would chain
    # 0..3 together, average linkage splits the long chain first.
    x = np.array([0.0, 0.55, 1.1, 1.65, 3.3, 3.35])
    S = np.cos(x[:, None] - x[None, :])
    assert _same_partition(cua._agglomerative_start(S, 2), _average_linkage_reference(S, 2))
    assert _same_partition(cua._agglomerative_start(S, 3), _average_linkage_reference(S, 3))


def _spectral_reference(S: np.ndarray, C: int, seed: int) -> np.ndarray:
    """Affinity W = (S + 1) / 2 without self-loops, L = D^-1/2 W D^-1/2, its top-C eigenvectors
    as unit-length rows, k-means++ (scipy kmeans2) with the given seed."""
    W = (np.asarray(S) + 1.0) / 2.0
    W = W - np.diag(np.diag(W))
    Dm = np.diag(1.0 / np.sqrt(W.sum(axis=1)))
    _, vecs = np.linalg.eigh(Dm @ W @ Dm)
    X = vecs[:, -C:]
    X = X / np.linalg.norm(X, axis=1)[:, None]
    return kmeans2(X, C, seed=seed, minit="++")[1]


@pytest.mark.parametrize("seed", range(8))
def test_spectral_start_is_kmeans_pp_on_the_normalised_affinity_eigenvectors(seed):
    rng = np.random.default_rng(100 + seed)
    K, C = int(rng.integers(6, 25)), int(rng.integers(2, 5))
    S = agg.cosine_similarity_matrix(rng.normal(size=(K, 3)))
    lab = cua._spectral_start(S, C, seed)
    assert lab.tolist() == _spectral_reference(S, C, seed).tolist()


def test_spectral_start_of_three_mutually_opposed_robots():
    # three unit vectors 120 degrees apart: W = 0.25 off the diagonal, degrees 0.5 (< 1);
    # a fourth robot next to robot 0 makes the degrees unequal.
    ang = np.array([0.0, 2.1, 4.2, 0.3])
    S = np.cos(ang[:, None] - ang[None, :])
    for seed in range(4):
        assert cua._spectral_start(S, 2, seed).tolist() == _spectral_reference(S, 2, seed).tolist()
    S3 = S[:3, :3]
    for seed in range(4):
        assert (
            cua._spectral_start(S3, 2, seed).tolist() == _spectral_reference(S3, 2, seed).tolist()
        )


@pytest.mark.parametrize(
    "V",
    [
        [[0.631, 1.039], [1.031, 1.818], [-0.385, 0.544], [-0.366, -1.425]],
        [[-0.18, -1.437], [0.633, 1.349], [1.238, -1.0], [-0.004, -0.3]],
    ],
)
def test_spectral_start_normalises_by_degrees_below_one_too(V):
    # one robot nearly opposed to the other three: its affinity degree is < 1
    S = agg.cosine_similarity_matrix(np.array(V))
    W = (S + 1.0) / 2.0 - np.eye(4)
    assert W.sum(axis=1).min() < 1.0
    assert cua._spectral_start(S, 2, 0).tolist() == _spectral_reference(S, 2, 0).tolist()


def _peel_reference(S: np.ndarray, C: int, singleton_intra: float) -> list[int]:
    """Everyone in group 0; then for s = 1..C-1 move to new group s the client (from a group of
    two or more) whose move gives the highest J with s + 1 groups, the first such on ties."""
    K = len(S)
    labels = np.zeros(K, dtype=int)
    for s in range(1, C):
        counts = np.bincount(labels, minlength=s)
        best, pick = -np.inf, None
        for i in range(K):
            if counts[labels[i]] < 2:
                continue
            moved = labels.copy()
            moved[i] = s
            val = cua.cua_objective(S, moved, s + 1, singleton_intra)
            if val > best + 1e-12:
                best, pick = val, i
        labels[pick] = s
    return labels.tolist()


@pytest.mark.parametrize("seed", range(16))
def test_peel_start_splits_off_the_best_client_each_time(seed):
    rng = np.random.default_rng(200 + seed)
    K = int(rng.integers(3, 10))
    C = int(rng.integers(2, K + 1))
    singleton_intra = float(rng.choice([0.0, 1.0, 0.5]))
    S = agg.cosine_similarity_matrix(rng.normal(size=(K, 3)))
    # (when the last split is of a pair, both picks are the same partition: rounding decides)
    assert _same_partition(
        cua._peel_start(_S0(S), C, singleton_intra), _peel_reference(S, C, singleton_intra)
    )


def _refine_reference(S0: np.ndarray, labels: np.ndarray, C: int, iters: int = 20) -> list[int]:
    """Each pass: every client to the group with the highest mean similarity to its *other*
    members (a group with no other member is no candidate), then `_repair`; stop when a pass
    changes nothing or after `iters` passes."""
    K = len(S0)
    labels = np.asarray(labels).copy()
    for _ in range(iters):
        new = np.empty(K, dtype=np.int64)
        for i in range(K):
            means = [
                S0[i, [j for j in range(K) if labels[j] == c and j != i]].mean()
                if any(labels[j] == c and j != i for j in range(K))
                else -np.inf
                for c in range(C)
            ]
            new[i] = int(np.argmax(means))
        new = cua._repair(new, S0, C)
        if new.tolist() == labels.tolist():
            break
        labels = new
    return labels.tolist()


@pytest.mark.parametrize("seed", range(20))
def test_batch_refine_matches_its_reference_from_random_starts(seed):
    rng = np.random.default_rng(300 + seed)
    K, C = int(rng.integers(4, 12)), int(rng.integers(2, 5))
    S0 = _S0(agg.cosine_similarity_matrix(rng.normal(size=(K, 2 + seed % 3))))
    start = cua._repair(rng.integers(0, C, size=K), S0, C)
    assert cua._batch_refine(S0, start, C).tolist() == _refine_reference(S0, start, C)
    for iters in (1, 2, 3):
        assert cua._batch_refine(S0, start, C, iters=iters).tolist() == _refine_reference(
            S0, start, C, iters
        )


def test_batch_refine_sends_a_lone_robot_to_its_best_group_even_if_all_are_dissimilar():
    # robot 3 is alone in group 1 and dislikes everyone; a lone robot has no "own group" mean,
    # so it joins the group it dislikes least (group 0) and _repair refills group 1 with the
    # least attached robot of group 0 (robot 2, mean -0.6 < robot 3's -0.2).
    S = np.array(
        [
            [1.0, 0.9, -0.8, -0.1],
            [0.9, 1.0, -0.8, -0.1],
            [-0.8, -0.8, 1.0, -0.4],
            [-0.1, -0.1, -0.4, 1.0],
        ]
    )
    S0 = _S0(S)
    assert cua._batch_refine(S0, np.array([0, 0, 0, 1]), 2, iters=1).tolist() == [0, 0, 1, 0]
    assert cua._batch_refine(S0, np.array([0, 0, 0, 1]), 2).tolist() == _refine_reference(
        S0, [0, 0, 0, 1], 2
    )
