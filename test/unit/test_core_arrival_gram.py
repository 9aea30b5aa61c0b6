"""CUA's Gram matrix built as updates arrive (fed_ros.core.strategies.arrival_gram, issue 39).

The arrival path moves FedDRMan's K^2 |Omega| similarity work to the time the server waits for
the rest of the fleet. It must decide as the close-time path does: the same Gram matrix up to
float32 summation order, the same partition, and the same cluster models to the bit, however the
updates arrive, whether some were never observed (a server restarted mid-round) and whichever
path (stacked or streamed) the strategy reads them with.
"""

from __future__ import annotations

import numpy as np
import pytest

from fed_ros.core.params import flatten, manifest_of, unflatten
from fed_ros.core.strategies.aggregate import update_similarity
from fed_ros.core.strategies.arrival_gram import ArrivalGram
from fed_ros.core.strategies.base import make_strategy
from fed_ros.core.strategies.types import ClientUpdate

INIT = {
    "encoder.w": np.linspace(-1, 1, 37 * 11, dtype=np.float32).reshape(37, 11),
    "temporal.w": np.linspace(0.5, -0.5, 230 * 19, dtype=np.float32).reshape(230, 19),
    "temporal.b": np.zeros(19, np.float32),
    "head.w": np.linspace(-0.3, 0.7, 13 * 17, dtype=np.float32).reshape(13, 17),
}
MANIFEST = manifest_of(INIT)
OMEGA = ["temporal.w", "temporal.b"]


def _updates(K: int, seed: int, families: int = 3) -> list[ClientUpdate]:
    """K robots in ``families`` update directions with noise, in a shuffled arrival order."""
    rng = np.random.default_rng(seed)
    theta0 = flatten(INIT)
    dirs = rng.standard_normal((families, theta0.size)).astype(np.float32) * 0.05
    out = []
    for k in range(K):
        noise = rng.standard_normal(theta0.size).astype(np.float32) * 0.02
        sd = unflatten(theta0 + dirs[k % families] + noise, MANIFEST, copy=True)
        out.append(ClientUpdate(f"robot_{k:03d}", sd, 10 + k, 0))
    return [out[i] for i in rng.permutation(K)]


def _batch_gram(updates: list[ClientUpdate]) -> np.ndarray:
    stacked = np.stack([flatten(u.params) for u in updates])
    cols = np.concatenate(
        [np.arange(a, b) for a, b in _ranges(OMEGA)]  # Omega columns, manifest order
    )
    origin = flatten(INIT)
    V = (stacked[:, cols] - origin[cols]).astype(np.float64)
    return V @ V.T


def _ranges(names):
    from fed_ros.core.params import offsets

    off = offsets(MANIFEST)
    return [off[n] for n in names]


@pytest.mark.parametrize("flush_every", [1, 3, 16])
def test_the_arrival_gram_is_the_batch_gram_in_any_order(flush_every):
    updates = _updates(21, seed=flush_every)
    gram = ArrivalGram(MANIFEST, OMEGA, INIT, capacity=2, flush_every=flush_every)
    for u in updates:
        gram.add(u.robot_id, u.params)
    order = sorted(u.robot_id for u in updates)
    by_id = {u.robot_id: u for u in updates}
    G = gram.gram(order)
    ref = _batch_gram([by_id[r] for r in order])
    assert G.shape == (21, 21)
    np.testing.assert_allclose(G, ref, rtol=1e-5, atol=1e-6 * np.abs(ref).max())
    np.testing.assert_array_equal(G, G.T)
    # A robot's second update replaces its first.
    again = _updates(1, seed=99)[0]
    gram.add(order[0], again.params)
    G2 = gram.gram(order)
    ref2 = _batch_gram([ClientUpdate(order[0], again.params, 1, 0)] + [by_id[r] for r in order[1:]])
    np.testing.assert_allclose(G2, ref2, rtol=1e-5, atol=1e-6 * np.abs(ref2).max())
    with pytest.raises(KeyError, match="robot_999"):
        gram.gram(["robot_999"])


def test_the_background_worker_computes_the_same_matrix_to_the_bit_at_any_pace():
    """Block ends depend on the arrivals only, so the worker thread and the caller compute the
    same blocks: the same bits however the arrivals and the worker interleave."""
    import time

    updates = _updates(40, seed=7)
    ids = [u.robot_id for u in updates]
    plain = ArrivalGram(MANIFEST, OMEGA, INIT, capacity=4, flush_every=5, expected=40)
    for u in updates:
        plain.add(u.robot_id, u.params)
    ref = plain.gram(ids)

    class SlowWorker(ArrivalGram):
        """A worker that is always inside a block when the next arrivals come."""

        def _block(self, rows, lo, hi):
            time.sleep(0.01)
            return super()._block(rows, lo, hi)

    rng = np.random.default_rng(0)
    for trial in range(4):
        kind = SlowWorker if trial == 3 else ArrivalGram
        worker = kind(
            MANIFEST, OMEGA, INIT, capacity=4, flush_every=5, expected=40, background=True
        )
        for u in updates:
            worker.add(u.robot_id, u.params)
            if rng.random() < 0.3:
                time.sleep(0.002 * trial)
        got = worker.gram(ids)
        worker.close()
        assert got.tobytes() == ref.tobytes(), trial
    closed = ArrivalGram(MANIFEST, OMEGA, INIT, flush_every=5, background=True)
    for u in updates[:12]:
        closed.add(u.robot_id, u.params)
    closed.close()  # the close leaves what the worker did not reach to gram()
    np.testing.assert_allclose(closed.gram(ids[:12]), plain.gram(ids[:12]), rtol=1e-6)
    assert closed.pending == 0


def test_the_rows_pending_are_computed_as_the_last_but_one_expected_update_arrives():
    """A round whose every participant answers closes with one row left to compute."""
    updates = _updates(10, seed=5)
    gram = ArrivalGram(MANIFEST, OMEGA, INIT, flush_every=16, expected=10)
    for k, u in enumerate(updates[:8]):
        gram.add(u.robot_id, u.params)
        assert gram.pending == k + 1
    gram.add(updates[8].robot_id, updates[8].params)
    assert gram.pending == 0
    gram.add(updates[9].robot_id, updates[9].params)
    assert gram.pending == 1
    unknown = ArrivalGram(MANIFEST, OMEGA, INIT, flush_every=16)  # participants not known
    for u in updates:
        unknown.add(u.robot_id, u.params)
    assert unknown.pending == 10
    ids = [u.robot_id for u in updates]
    ref = unknown.gram(ids)
    np.testing.assert_allclose(gram.gram(ids), ref, rtol=1e-5, atol=1e-6 * np.abs(ref).max())


def test_the_arrival_cosines_match_the_close_time_similarity():
    updates = sorted(_updates(12, seed=4), key=lambda u: u.robot_id)
    gram = ArrivalGram(MANIFEST, OMEGA, INIT, flush_every=5)
    for u in updates:
        gram.add(u.robot_id, u.params)
    from fed_ros.core.params import prefix_columns
    from fed_ros.core.strategies.aggregate import gram_to_cosine

    S_close = update_similarity(
        np.stack([flatten(u.params) for u in updates]),
        prefix_columns(MANIFEST, ("temporal.",)),
        flatten(INIT),
    )
    S_arrival = gram_to_cosine(gram.gram([u.robot_id for u in updates]))
    np.testing.assert_allclose(S_arrival, S_close, atol=1e-6)


def _feddrman(stack: bool):
    s = make_strategy("feddrman", num_clusters=3, beta=0.9, stack_updates=stack)
    return s


@pytest.mark.parametrize("stack", [True, False])
@pytest.mark.parametrize("observed", ["all", "some", "none"])
def test_feddrman_decides_the_same_with_and_without_arrival_rows(stack, observed):
    """Three rounds; the arrival path (every, some or no update observed before the close) gives
    the close-time path's partition and cluster models to the bit."""
    ids = [f"robot_{k:03d}" for k in range(20)]
    plain, arriving = _feddrman(stack), _feddrman(stack)
    plain.initialize(INIT, ids)
    arriving.initialize(INIT, ids)
    for r in range(3):
        updates = _updates(20, seed=10 + r)
        for i, u in enumerate(updates):
            u.base_round = r
            if observed == "all" or (observed == "some" and i % 3):
                arriving.observe(r, u)
        ordered = sorted(updates, key=lambda u: u.robot_id)
        a = plain.aggregate_round(r, list(ordered), {})
        b = arriving.aggregate_round(r, list(ordered), {})
        assert a.diagnostics["partition"] == b.diagnostics["partition"], r
        np.testing.assert_allclose(
            a.diagnostics["similarity"], b.diagnostics["similarity"], atol=2e-6
        )
        assert a.assignments == b.assignments
        assert sorted(a.cluster_models) == sorted(b.cluster_models)
        for c, model in a.cluster_models.items():
            for name, value in model.items():
                assert value.tobytes() == b.cluster_models[c][name].tobytes(), (r, c, name)
    # The three families were found (the updates are built to be separable).
    groups = {}
    for rid, label in zip(sorted(ids), a.diagnostics["partition"]):
        groups.setdefault(label, set()).add(int(rid[-3:]) % 3)
    assert all(len(fams) == 1 for fams in groups.values())


def test_an_observed_update_from_another_round_is_never_used():
    ids = [f"robot_{k:03d}" for k in range(9)]
    s = _feddrman(False)
    s.initialize(INIT, ids)
    stale = _updates(9, seed=1)
    for u in stale:
        s.observe(0, u)  # observed for round 0, but round 0 is abandoned
    fresh = sorted(_updates(9, seed=2), key=lambda u: u.robot_id)
    plain = _feddrman(False)
    plain.initialize(INIT, ids)
    a = plain.aggregate_round(1, list(fresh), {})
    b = s.aggregate_round(1, list(fresh), {})
    assert a.diagnostics["similarity"] == b.diagnostics["similarity"]


def test_a_non_finite_update_observed_on_arrival_is_refused_at_the_close_naming_it():
    ids = [f"robot_{k:03d}" for k in range(6)]
    s = _feddrman(False)
    s.initialize(INIT, ids)
    updates = sorted(_updates(6, seed=3), key=lambda u: u.robot_id)
    updates[2].params["temporal.w"][0, 0] = np.nan
    for u in updates:
        s.observe(0, u)
    with pytest.raises(ValueError, match="robot_002"):
        s.aggregate_round(0, updates, {})
