"""Attack harness, B1 bounded influence, B2 aggregator laws, B3 attack table with stated bounds."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st
from hypothesis.extra import numpy as hnp

from fed_ros.bench import robustness as bench
from fed_ros.core.security import attacks
from fed_ros.core.data.episode import Episode, OBJECT_STATE
from fed_ros.core.strategies.robust import aggregate_robust


def test_model_attacks_do_what_they_say():
    ref = np.zeros(100, np.float32)
    upd = np.linspace(-1, 1, 100).astype(np.float32)
    np.testing.assert_allclose(attacks.attack_vector(upd, ref, "sign_flip"), -upd)
    np.testing.assert_allclose(attacks.attack_vector(upd, ref, "scale10"), 10 * upd, rtol=1e-6)
    np.testing.assert_allclose(attacks.attack_vector(upd, ref, "scale100"), 100 * upd, rtol=1e-6)
    np.testing.assert_array_equal(attacks.attack_vector(upd, ref, "none"), upd)
    noisy = attacks.attack_vector(upd, ref, "gaussian", noise_std=2.0, seed=1)
    assert abs(float(np.std(noisy)) - 2.0) < 0.5
    np.testing.assert_array_equal(
        noisy, attacks.attack_vector(upd, ref, "gaussian", noise_std=2.0, seed=1)
    )
    nan = attacks.attack_vector(upd, ref, "nan", nan_fraction=0.05)
    assert int(np.isnan(nan).sum()) == 5 and nan.dtype == np.float32
    assert np.isnan(attacks.attack_vector(upd[:3], ref[:3], "nan")).sum() == 1  # at least one
    assert np.all(upd == np.linspace(-1, 1, 100).astype(np.float32))  # input untouched


def test_attack_errors_name_the_value():
    with pytest.raises(ValueError, match="unknown model attack 'boom'"):
        attacks.attack_vector(np.zeros(2), np.zeros(2), "boom")
    with pytest.raises(ValueError, match=r"update shape \(2,\) != reference shape \(3,\)"):
        attacks.attack_vector(np.zeros(2), np.zeros(3), "none")
    with pytest.raises(ValueError, match="label_flip mode must be"):
        attacks.label_flip([], mode="upside_down")


def test_attack_state_dict_keeps_schema():
    ref = {"a": np.zeros((2, 3), np.float32), "b": np.ones(4, np.float32)}
    upd = {"a": np.full((2, 3), 0.5, np.float32), "b": np.full(4, 2.0, np.float32)}
    out = attacks.attack_state_dict(upd, ref, "sign_flip")
    assert list(out) == ["a", "b"] and out["a"].shape == (2, 3) and out["a"].dtype == np.float32
    np.testing.assert_allclose(out["a"], -0.5)
    np.testing.assert_allclose(out["b"], 0.0)
    with pytest.raises(ValueError, match="different tensors"):
        attacks.attack_state_dict({"a": upd["a"]}, ref, "none")


def _episodes(n: int = 3, steps: int = 10) -> list[Episode]:
    rng = np.random.default_rng(0)
    return [
        Episode(
            "lift",
            "lift",
            {OBJECT_STATE: rng.normal(size=(steps, 32)).astype(np.float32)},
            rng.uniform(-1, 1, (steps, 4)).astype(np.float32),
        )
        for _ in range(n)
    ]


def test_label_flip_negate_and_shuffle():
    eps = _episodes()
    neg = attacks.label_flip(eps, "negate")
    for a, b in zip(eps, neg):
        np.testing.assert_array_equal(b.actions, -a.actions)
        assert (
            b.observations is a.observations
            or b.observations[OBJECT_STATE] is a.observations[OBJECT_STATE]
        )
        assert b.metadata["attack"] == "label_flip_negate" and "attack" not in a.metadata
    shuf = attacks.label_flip(eps, "shuffle", seed=3)
    pooled = np.concatenate([e.actions for e in eps])
    shuffled = np.concatenate([e.actions for e in shuf])
    assert [len(e) for e in shuf] == [len(e) for e in eps]
    # Same multiset of actions, different pairing with observations.
    np.testing.assert_array_equal(np.sort(pooled, axis=0), np.sort(shuffled, axis=0))
    assert not np.array_equal(pooled, shuffled)


# ----------------------------------------------------------------------------- B1 bounded influence


@settings(max_examples=200, deadline=None)
@given(
    honest=hnp.arrays(np.float32, (4, 16), elements=st.floats(-10, 10, width=32)),
    attacker=hnp.arrays(np.float32, 16, elements=st.floats(-1e6, 1e6, width=32)),
    clip=st.floats(0.01, 10.0),
)
def test_b1_clip_bounds_one_clients_influence(honest, attacker, clip):
    """B1: with norm clipping, one of n clients moves the aggregate by at most clip/n."""
    reference = np.zeros(16, np.float32)
    n = 5
    with_attacker = np.concatenate([attacker[None], honest])
    without = np.concatenate([reference[None], honest])  # the attacker sends no change at all
    a = aggregate_robust(with_attacker, np.ones(n), "clip", clip_norm=clip, reference=reference)
    b = aggregate_robust(without, np.ones(n), "clip", clip_norm=clip, reference=reference)
    moved = float(np.linalg.norm(a.astype(np.float64) - b))
    assert moved <= clip / n * (1 + 1e-4) + 1e-4


def test_b1_measured_figures_per_attack():
    """Measured: every attack moves the clipped aggregate by <= 2 clip/n vs the no-attack run."""
    rows = bench.attack_table(*_synthetic(), attacks.MODEL_ATTACKS[:-1], "b1")
    figures = {r.attack: (round(r.clip_shift, 4), round(r.clip_bound, 4)) for r in rows}
    print("B1 clip shift vs bound 2c/n (relative to the honest step):", figures)
    for r in rows:
        assert r.clip_shift <= r.clip_bound + 1e-6, (r.attack, r.clip_shift, r.clip_bound)
    # Without clipping the same attack moves it far past the bound (the test can fail).
    assert (
        next(r for r in rows if r.attack == "scale100").distance["mean"] > 10 * rows[0].clip_bound
    )


def _synthetic(n: int = 5, dim: int = 2000, seed: int = 0):
    honest, reference = bench.synthetic_updates(n, dim, seed)
    return honest, reference, lambda a: attacks.attack_vector(honest[0], reference, a, seed=seed)


# ----------------------------------------------------------------------------- B2 aggregator laws


@settings(max_examples=50, deadline=None)
@given(
    data=hnp.arrays(np.float32, (5, 8), elements=st.floats(-100, 100, width=32)),
    perm=st.permutations(range(5)),
)
def test_b2_order_invariance(data, perm):
    ref = np.zeros(8, np.float32)
    for rule, kw in [
        ("median", {}),
        ("trimmed_mean", {"trim": 0.2}),
        ("multi_krum", {"f": 1}),
        ("clip", {"clip_norm": 5.0, "reference": ref}),
    ]:
        a = aggregate_robust(data, np.ones(5), rule, **kw)
        b = aggregate_robust(data[list(perm)], np.ones(5), rule, **kw)
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-4, err_msg=rule)


def test_b2_identical_honest_inputs_unchanged_and_krum_refuses():
    row = np.linspace(-1, 1, 32).astype(np.float32)
    stacked = np.tile(row, (5, 1))
    for rule, kw in [
        ("median", {}),
        ("trimmed_mean", {"trim": 0.2}),
        ("multi_krum", {"f": 1}),
        ("clip", {"clip_norm": 100.0}),
        ("mean", {}),
    ]:
        np.testing.assert_allclose(
            aggregate_robust(stacked, np.ones(5), rule, **kw), row, rtol=1e-6
        )
    with pytest.raises(ValueError, match="n >= 2f\\+3"):
        aggregate_robust(stacked[:4], np.ones(4), "multi_krum", f=1)


# ----------------------------------------------------------------------------- B3 attack table

# Stated bounds (relative to the honest FedAvg step): robust rules stay within these for f = 1 of 5.
B3_ROBUST_BOUND = 0.5


@pytest.fixture(scope="module")
def table():
    return bench.run(quick=True, seed=0)


def test_b3_every_attack_bounded_under_robust_rules(table):
    assert {r.attack for r in table} == set(attacks.ATTACKS)
    for r in table:
        for rule in ("median", "trimmed_mean"):
            assert r.distance[rule] <= B3_ROBUST_BOUND, (
                r.setting,
                r.attack,
                rule,
                r.distance[rule],
            )
        if r.distance["multi_krum"] is not None:
            assert r.distance["multi_krum"] <= B3_ROBUST_BOUND, (r.setting, r.attack)
        else:  # only after the NaN update was rejected: 4 left < 2f+3
            assert r.attack == "nan" and not r.validated
        if r.validated:
            assert r.clip_shift <= r.clip_bound + 1e-6, (r.setting, r.attack, r.clip_shift)


def test_b3_nan_rejected_by_validation_and_scaling_breaks_fedavg(table):
    by = {(r.setting.split()[0], r.attack): r for r in table}
    for setting in ("updates", "linear-bc"):
        nan = by[(setting, "nan")]
        assert not nan.validated and np.isnan(nan.distance["mean_unvalidated"])
        assert nan.distance["mean"] < B3_ROBUST_BOUND  # the other four were aggregated as usual
        assert by[(setting, "scale100")].distance["mean"] > 10.0
    # Label flipping degrades plain FedAvg's policy; the median keeps it near the no-attack quality.
    flip, clean = by[("linear-bc", "label_flip_negate")], by[("linear-bc", "none")]
    assert flip.action_mse["mean"] > 1.3 * clean.action_mse["mean"]
    assert flip.action_mse["median"] < 1.2 * clean.action_mse["mean"]


def test_bench_cli_prints_table(capsys, tmp_path):
    assert bench.main(["--quick", "--dim", "5000", "--json", str(tmp_path / "t.json")]) == 0
    out = capsys.readouterr().out
    assert "| linear-bc | label_flip_shuffle |" in out and "refused" in out
    assert bench.main(["--clients", "3"]) == 2
