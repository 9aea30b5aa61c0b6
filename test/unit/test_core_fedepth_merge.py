"""merge_subsets (packed-byte dedup, all-client exit) against the np.unique reference."""

from __future__ import annotations

import numpy as np
import pytest

from fed_ros.core.clustering.fedepth import (
    calibrate_tau,
    jeffreys_matrix,
    merge_subsets,
    soft_clusters,
)


def _reference_merge(M: np.ndarray) -> np.ndarray:
    """The definition: distinct non-empty rows minus every proper subset of another row."""
    rows = np.unique(M, axis=0)
    rows = rows[rows.any(axis=1)]
    keep = [r for r in rows if not any((r <= o).all() and o.sum() > r.sum() for o in rows)]
    out = np.array(keep, dtype=bool).reshape(-1, M.shape[1])
    order = sorted(range(len(out)), key=lambda i: tuple(np.flatnonzero(out[i]).tolist()))
    return out[order]


@pytest.mark.parametrize("density", [0.05, 0.3, 0.7, 0.95])
@pytest.mark.parametrize("seed", range(5))
def test_merge_equals_the_reference_on_random_memberships(density, seed):
    rng = np.random.default_rng(seed)
    M = rng.random((30, 30)) < density
    np.fill_diagonal(M, True)
    M[3] = M[7]  # a duplicate row
    assert np.array_equal(merge_subsets(M), _reference_merge(M))


def test_a_row_holding_every_client_leaves_one_cluster():
    M = np.eye(6, dtype=bool)
    M[4] = True
    assert np.array_equal(merge_subsets(M), np.ones((1, 6), dtype=bool))


def test_calibration_to_no_overlap_finds_the_two_planted_groups():
    rng = np.random.default_rng(0)
    means = np.concatenate([rng.normal(0, 0.1, (20, 8)), rng.normal(3, 0.1, (20, 8))])
    A = jeffreys_matrix(means, np.ones_like(means))
    tau, overlap = calibrate_tau(A, 0.0)
    assert overlap == 0.0
    assert soft_clusters(A, tau) == [tuple(range(20)), tuple(range(20, 40))]
