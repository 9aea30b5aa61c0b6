"""Strategy base class and its data types, exactly: FedAvg weighting by num_samples, per-cluster
averages, robust rules per cluster, cluster routing and membership means, stable cluster ids,
round-config dispatch and defaults, persistence, and error messages that name the bad value.

ROS-free, no torch.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fed_ros.core.strategies import base as strategy_mod
from fed_ros.core.params import flatten, manifest_of, manifest_to_json
from fed_ros.core.rounds.config import RobotInstruction, RoundConfig
from fed_ros.core.strategies.base import (
    STRATEGIES,
    Strategy,
    _readonly,
    make_strategy,
)
from fed_ros.core.strategies.cluster_ids import match_cluster_ids
from fed_ros.core.strategies.types import (
    ClientDescriptor,
    ClientUpdate,
    DESCRIPTOR_KINDS,
    RoundResult,
)

INIT = {
    "w": np.array([[1.0, -2.0], [3.0, 0.5]], np.float32),
    "b": np.array([0.0, 1.0, -1.0], np.float32),
}
MAN = manifest_of(INIT)
P = 7


def _vec(values) -> np.ndarray:
    return np.asarray(values, dtype=np.float32).reshape(P)


def _sd(vec) -> dict[str, np.ndarray]:
    v = np.asarray(vec, np.float32)
    return {"w": v[:4].reshape(2, 2).copy(), "b": v[4:].copy()}


def _up(rid: str, vec, n: int = 1, base_round: int = 0, cluster_id: int = -1) -> ClientUpdate:
    return ClientUpdate(rid, _sd(vec), n, base_round, cluster_id)


def _fedavg(ids=("a", "b", "c"), **kw) -> Strategy:
    s = make_strategy("fedavg", **kw)
    s.initialize({k: v.copy() for k, v in INIT.items()}, list(ids))
    return s


def _state(
    name: str, clusters: dict[int, np.ndarray], assignments: dict, theta0=None
) -> tuple[dict, dict]:
    arrays = {"theta0": flatten(INIT) if theta0 is None else theta0}
    arrays.update({f"cluster/{c}": np.asarray(v, np.float32) for c, v in clusters.items()})
    meta = {
        "name": name,
        "manifest": manifest_to_json(MAN),
        "assignments": {r: [[c, w] for c, w in m] for r, m in assignments.items()},
        "extra": {},
    }
    return arrays, meta


def _loaded(
    clusters: dict[int, np.ndarray], assignments: dict, name: str = "fedavg", **kw
) -> Strategy:
    s = make_strategy(name, **kw)
    s.load_state(*_state(name, clusters, assignments))
    return s


class _Grouped(Strategy):
    """A minimal strategy: averages the given robot groups into clusters 0..G-1 (base-class
    helpers)."""

    name = "grouped"

    def __init__(self, groups, **kw) -> None:
        super().__init__(**kw)
        self.groups = groups

    def aggregate_round(self, round_idx, updates, descriptors):
        prep = self._prepare(round_idx, updates)
        groups = [[prep.robot_ids.index(r) for r in g] for g in self.groups]
        avg = self._average_groups(prep, groups)
        for g in range(len(groups)):
            self._models[g] = _readonly(avg[g])
        return self._result({"round": round_idx, "robust": "set by the strategy"})


# ----------------------------------------------------------------------------- FedAvg maths


def test_fedavg_weights_each_update_by_its_sample_count():
    s = _fedavg()
    x = [np.arange(P) + 1.0, np.full(P, 10.0), -np.arange(P) * 2.0]
    n = [1, 3, 4]
    res = s.aggregate_round(0, [_up(r, v, k) for r, v, k in zip("abc", x, n)], {})
    expected = (1 * x[0] + 3 * x[1] + 4 * x[2]) / 8.0
    np.testing.assert_allclose(flatten(res.cluster_models[0]), expected, rtol=1e-6, atol=1e-6)
    assert res.assignments == {"a": [(0, 1.0)], "b": [(0, 1.0)], "c": [(0, 1.0)]}
    assert res.diagnostics["num_samples"] == [1.0, 3.0, 4.0]
    assert res.diagnostics["strategy"] == "fedavg" and res.diagnostics["robust"] == "mean"
    np.testing.assert_array_equal(flatten(s.model_for("a")), flatten(res.cluster_models[0]))


def test_zero_sample_update_has_no_weight_and_all_zero_is_refused():
    s = _fedavg()
    res = s.aggregate_round(0, [_up("a", np.full(P, 2.0), 5), _up("b", np.full(P, 1e6), 0)], {})
    np.testing.assert_array_equal(flatten(res.cluster_models[0]), np.full(P, 2.0, np.float32))
    with pytest.raises(
        ValueError, match=r"^num_samples sum to 0\.0; at least one client needs samples > 0$"
    ):
        s.aggregate_round(1, [_up("a", np.ones(P), 0), _up("b", np.ones(P), 0)], {})


_vals = st.lists(st.floats(-1e3, 1e3, width=32), min_size=P, max_size=P)


@settings(max_examples=40, deadline=None)
@given(
    rows=st.lists(_vals, min_size=1, max_size=6),
    counts=st.data(),
    scale=st.sampled_from([2, 4, 1024]),
)
def test_fedavg_is_scale_invariant_in_the_sample_counts_and_a_convex_combination(
    rows, counts, scale
):
    n = counts.draw(st.lists(st.integers(1, 1000), min_size=len(rows), max_size=len(rows)))
    ids = [f"r{i}" for i in range(len(rows))]
    outs = []
    for factor in (1, scale):
        s = _fedavg(ids)
        ups = [_up(r, v, k * factor) for r, v, k in zip(ids, rows, n)]
        outs.append(flatten(s.aggregate_round(0, ups, {}).cluster_models[0]))
    np.testing.assert_array_equal(outs[0], outs[1])  # same weights, same bits
    X = np.asarray(rows, np.float64)
    w = np.asarray(n, np.float64) / sum(n)
    np.testing.assert_allclose(outs[0], w @ X, rtol=1e-5, atol=1e-3)
    assert (outs[0] >= X.min(axis=0) - 1e-3).all() and (outs[0] <= X.max(axis=0) + 1e-3).all()


@settings(max_examples=25, deadline=None)
@given(
    row=_vals,
    n=st.lists(st.integers(1, 50), min_size=1, max_size=5),
    robust=st.sampled_from(["mean", "median", "trimmed_mean"]),
)
def test_averaging_identical_updates_returns_that_update(row, n, robust):
    ids = [f"r{i}" for i in range(len(n))]
    s = _fedavg(ids, robust=robust)
    res = s.aggregate_round(0, [_up(r, row, k) for r, k in zip(ids, n)], {})
    np.testing.assert_allclose(
        flatten(res.cluster_models[0]), np.asarray(row, np.float32), rtol=1e-6, atol=1e-6
    )


# ------------------------------------------------------------------------- per-cluster averages


def test_each_cluster_averages_only_its_own_members_with_their_weights():
    s = _Grouped([["a", "c"], ["b", "d"]])
    s.initialize(INIT, ["a", "b", "c", "d"])
    vals = {"a": 1.0, "b": 10.0, "c": 4.0, "d": 20.0}
    n = {"a": 2, "b": 1, "c": 1, "d": 3}
    res = s.aggregate_round(
        0, [_up(r, np.full(P, vals[r]), n[r]) for r in ("d", "c", "b", "a")], {}
    )
    np.testing.assert_allclose(
        flatten(res.cluster_models[0]), np.full(P, (2 * 1.0 + 4.0) / 3), rtol=1e-6
    )
    np.testing.assert_allclose(
        flatten(res.cluster_models[1]), np.full(P, (10.0 + 3 * 20.0) / 4), rtol=1e-6
    )
    # The strategy's own diagnostics win over the defaults; the name is filled in.
    assert res.diagnostics == {"round": 0, "robust": "set by the strategy", "strategy": "grouped"}


def test_empty_cluster_group_is_refused_naming_it():
    s = _Grouped([["a"], []])
    s.initialize(INIT, ["a"])
    with pytest.raises(ValueError, match=r"^cluster group 1 is empty$"):
        s.aggregate_round(0, [_up("a", np.ones(P))], {})
    s = _Grouped([[], ["a"]], robust="median")
    s.initialize(INIT, ["a"])
    with pytest.raises(ValueError, match=r"^cluster group 0 is empty$"):
        s.aggregate_round(0, [_up("a", np.ones(P))], {})


@pytest.mark.parametrize("robust", ["mean", "median", "clip"])
@pytest.mark.parametrize("bad_robot", ["r0", "r1", "r3"])
def test_nan_update_is_refused_naming_that_robot_wherever_it_is_in_its_cluster(robust, bad_robot):
    s = make_strategy("ifca", num_clusters=2, robust=robust)
    s.initialize(INIT, ["r0", "r1", "r2", "r3"])
    bad = np.ones(P)
    bad[5] = np.nan
    choice = {"r0": 0, "r1": 1, "r2": 0, "r3": 1}
    ups = [_up(r, bad if r == bad_robot else np.ones(P), cluster_id=c) for r, c in choice.items()]
    with pytest.raises(ValueError, match=rf"^update of '{bad_robot}' holds NaN/Inf values$"):
        s.aggregate_round(0, ups[::-1], {})
    np.testing.assert_array_equal(
        flatten(s.model_for(bad_robot)), flatten(INIT)
    )  # the refused round changed nothing


@pytest.mark.parametrize("robust", ["mean", "trimmed_mean"])
def test_inf_in_the_first_robots_update_is_refused_naming_it(robust):
    bad = np.ones(P)
    bad[0] = -np.inf
    with pytest.raises(ValueError, match=r"^update of 'a' holds NaN/Inf values$"):
        _fedavg(robust=robust).aggregate_round(
            0, [_up("b", np.ones(P)), _up("a", bad), _up("c", np.ones(P))], {}
        )


def test_average_that_overflows_is_reported_as_overflow_not_blamed_on_a_robot(monkeypatch):
    s = _fedavg()
    real = strategy_mod.weighted_sums  # the streamed path (the default) sums in place

    def overflowing(sds, W, manifest, out=None):
        res = real(sds, W, manifest, out=out)
        res[0, 2] = np.inf  # what float32 rounding does to weights summing just over 1 at 3.4e38
        return res

    monkeypatch.setattr(strategy_mod, "weighted_sums", overflowing)
    with pytest.raises(ValueError, match=r"^cluster average overflowed to Inf$"):
        s.aggregate_round(0, [_up("a", np.ones(P)), _up("b", np.ones(P))], {})


def test_median_rule_is_applied_per_cluster():
    s = make_strategy("ifca", num_clusters=2, robust="median")
    s.initialize(INIT, list("abcde"))
    ups = [
        _up("a", np.full(P, 1.0), 100, cluster_id=0),
        _up("b", np.full(P, 2.0), 1, cluster_id=0),
        _up("c", np.full(P, 50.0), 1, cluster_id=0),
        _up("d", np.full(P, -3.0), 1, cluster_id=1),
        _up("e", np.full(P, 5.0), 9, cluster_id=1),
    ]
    res = s.aggregate_round(0, ups, {})
    np.testing.assert_array_equal(flatten(res.cluster_models[0]), np.full(P, 2.0, np.float32))
    np.testing.assert_array_equal(flatten(res.cluster_models[1]), np.full(P, 1.0, np.float32))
    assert res.diagnostics["robust"] == "median" and res.diagnostics["updated_clusters"] == [0, 1]


def test_clip_rule_clips_around_each_clusters_previous_model_weighted_by_samples():
    s = make_strategy(
        "ifca", num_clusters=2, robust="clip", robust_kwargs={"clip_norm": 1.0}, init_noise=0.0
    )
    s.initialize(INIT, ["a", "b", "c"])
    theta0 = flatten(INIT).astype(np.float64)
    e = np.zeros(P)
    e[0] = 1.0
    ups = [
        _up("a", theta0 + 10.0 * e, 3, cluster_id=1),
        _up("b", theta0 + 0.5 * e, 1, cluster_id=1),
        _up("c", theta0 - 4.0 * e, 1, cluster_id=0),
    ]
    res = s.aggregate_round(0, ups, {})
    # Around the cluster's model theta0: a's step is clipped to norm 1, b's (0.5) is kept.
    np.testing.assert_allclose(
        flatten(res.cluster_models[1]), theta0 + (3 * 1.0 + 1 * 0.5) / 4 * e, atol=1e-6
    )
    np.testing.assert_allclose(flatten(res.cluster_models[0]), theta0 - 1.0 * e, atol=1e-6)


def test_clip_reference_given_in_the_settings_wins_over_the_clusters_model():
    ref = np.zeros(P, np.float32)
    s = make_strategy("fedavg", robust="clip", robust_kwargs={"clip_norm": 2.0, "reference": ref})
    s.initialize(INIT, ["a"])
    target = np.zeros(P)
    target[3] = 8.0
    res = s.aggregate_round(0, [_up("a", target)], {})
    expected = np.zeros(P)
    expected[3] = 2.0  # clipped around zeros, not around theta0
    np.testing.assert_allclose(flatten(res.cluster_models[0]), expected, atol=1e-6)


def test_robust_settings_are_copied_at_construction():
    kw = {"clip_norm": 1.0}
    s = make_strategy("fedavg", robust="clip", robust_kwargs=kw)
    kw["clip_norm"] = 1e9
    assert s.robust_kwargs == {"clip_norm": 1.0}
    assert make_strategy("fedavg").robust_kwargs == {} and make_strategy("fedavg").robust == "mean"


def test_unknown_robust_rule_is_refused_naming_it_and_the_choices():
    with pytest.raises(ValueError) as exc:
        make_strategy("fedavg", robust="average")
    assert (
        str(exc.value)
        == "robust rule 'average' not in ('mean', 'median', 'trimmed_mean', 'clip', 'multi_krum')"
    )


def test_results_held_by_the_caller_never_change_in_later_rounds():
    s = _fedavg(["a", "b"])
    held = []
    for r in range(6):
        res = s.aggregate_round(
            r, [_up("a", np.full(P, float(r)), 1), _up("b", np.full(P, float(r) + 2), 1)], {}
        )
        if r % 2 == 0:
            held.append((r, res.cluster_models[0]["b"]))
        del res
    for r, arr in held:
        np.testing.assert_array_equal(arr, np.full(3, r + 1.0, np.float32))


# --------------------------------------------------------------------------- _prepare checks


def test_round_without_updates_is_refused_naming_strategy_and_round():
    with pytest.raises(ValueError, match=r"^fedavg: round 3 has no updates$"):
        _fedavg().aggregate_round(3, [], {})


def test_non_update_is_refused_naming_its_type():
    with pytest.raises(ValueError, match=r"^expected ClientUpdate, got dict$"):
        _fedavg().aggregate_round(0, [{"robot_id": "a"}], {})


def test_duplicate_update_is_refused_naming_the_robot():
    with pytest.raises(ValueError, match=r"^duplicate update from robot 'b'$"):
        _fedavg().aggregate_round(
            0, [_up("b", np.ones(P)), _up("a", np.ones(P)), _up("b", np.ones(P))], {}
        )


def test_update_from_a_future_round_is_refused_and_the_current_round_accepted():
    s = _fedavg()
    with pytest.raises(ValueError, match=r"^update of 'a' has base_round 4 > round 3$"):
        s.aggregate_round(3, [_up("a", np.ones(P), base_round=4)], {})
    res = s.aggregate_round(
        3, [_up("a", np.ones(P), base_round=3), _up("b", np.full(P, 3.0), base_round=1)], {}
    )
    np.testing.assert_array_equal(flatten(res.cluster_models[0]), np.full(P, 2.0, np.float32))


def test_update_of_another_architecture_is_refused_naming_robot_and_tensor():
    bad = ClientUpdate("c", {"w": np.zeros((2, 2), np.float32), "b": np.zeros(4, np.float32)}, 1, 0)
    with pytest.raises(
        ValueError, match=r"^update of 'c': tensor 'b' has shape \(4,\), expected \(3,\)$"
    ):
        _fedavg().aggregate_round(0, [_up("a", np.ones(P)), bad], {})


@pytest.mark.parametrize("bad", [-3, float("nan")])
def test_sample_count_changed_after_construction_is_still_refused_naming_the_robot(bad):
    u = _up("b", np.ones(P), 2)
    u.num_samples = bad  # a mutable dataclass: the strategy re-checks what it weights by
    with pytest.raises(ValueError, match=r"^num_samples of b is .*; must be a finite count >= 0$"):
        _fedavg().aggregate_round(0, [_up("a", np.ones(P)), u], {})


def test_robots_are_reported_in_id_order_whatever_the_arrival_order():
    s = _fedavg()
    res = s.aggregate_round(
        0, [_up("c", np.ones(P), 3), _up("a", np.ones(P), 1), _up("b", np.ones(P), 2)], {}
    )
    assert res.diagnostics["robots"] == ["a", "b", "c"] and res.diagnostics["num_samples"] == [
        1.0,
        2.0,
        3.0,
    ]


def test_calls_before_initialize_are_refused_naming_the_strategy():
    s = make_strategy("ifca")
    for call in (
        lambda: s.manifest,
        s.cluster_models,
        lambda: s.model_for("a"),
        lambda: s.configure_round(0, ["a"]),
        s.state,
        lambda: s.aggregate_round(0, [_up("a", np.ones(P))], {}),
    ):
        with pytest.raises(ValueError, match=r"^ifca: initialize\(\) has not been called$"):
            call()


# --------------------------------------------------------------------------------- initialize


def test_initialize_puts_every_robot_in_cluster_zero_with_a_readonly_copy_of_theta0():
    init = {k: v.copy() for k, v in INIT.items()}
    s = make_strategy("fedavg")
    s.initialize(init, ["x", "y"])
    init["b"][:] = 99.0  # the caller reuses its buffer
    assert s.manifest == MAN and s.cluster_ids() == [0]
    models = s.cluster_models()
    np.testing.assert_array_equal(flatten(models[0]), flatten(INIT))
    assert not models[0]["w"].flags.writeable
    with pytest.raises(ValueError):
        models[0]["w"][0, 0] = 5.0
    assert s.state()[1]["assignments"] == {"x": [[0, 1.0]], "y": [[0, 1.0]]}


def test_initialize_again_forgets_earlier_models_and_robots():
    s = _fedavg(["a", "b"])
    s.aggregate_round(0, [_up("a", np.full(P, 9.0))], {})
    s.initialize(INIT, ["z"])
    assert s.state()[1]["assignments"] == {"z": [[0, 1.0]]}
    np.testing.assert_array_equal(flatten(s.model_for("z")), flatten(INIT))


@pytest.mark.parametrize(
    "initial,ids,message",
    [
        ({}, ["a"], "initial state dict is empty"),
        (INIT, [""], "robot id '' is not a non-empty string"),
        (INIT, ["a", 7], "robot id 7 is not a non-empty string"),
        (INIT, ["a", "b", "a"], "duplicate robot ids in ['a', 'b', 'a']"),
        ({"w": np.array([1.0, np.inf], np.float32)}, ["a"], "initial model holds NaN/Inf values"),
        ({"w": np.array([np.nan], np.float32)}, [], "initial model holds NaN/Inf values"),
    ],
)
def test_bad_initial_model_or_robot_ids_are_refused(initial, ids, message):
    with pytest.raises(ValueError) as exc:
        make_strategy("fedavg").initialize(initial, ids)
    assert str(exc.value) == message


# ------------------------------------------------------------------- membership and routing


def test_model_for_a_soft_member_is_the_normalised_weighted_mean_of_its_clusters():
    m0, m1, m2 = np.full(P, 1.0), np.arange(P, dtype=np.float64), np.full(P, -8.0)
    s = _loaded(
        {0: m0, 1: m1, 2: m2}, {"soft": [(0, 1.0), (1, 3.0), (2, 0.0)], "one": [(2, 0.0), (1, 2.0)]}
    )
    got = s.model_for("soft")
    np.testing.assert_allclose(flatten(got), 0.25 * m0 + 0.75 * m1, rtol=1e-6, atol=1e-6)
    assert not got["w"].flags.writeable
    np.testing.assert_array_equal(
        flatten(s.model_for("one")), m1.astype(np.float32)
    )  # weight-0 entries ignored
    assert not s.model_for("one")["b"].flags.writeable


@pytest.mark.parametrize(
    "mem,message",
    [
        ([(0, 0.0)], "membership [(0, 0.0)] has no cluster with weight > 0"),
        ([(0, 0.5), (9, 0.5)], "membership refers to unknown cluster 9"),
        ([(9, 1.0)], "membership refers to unknown cluster 9"),
    ],
)
def test_membership_without_a_usable_cluster_is_refused(mem, message):
    s = _loaded({0: np.zeros(P)}, {"r": mem})
    with pytest.raises(ValueError) as exc:
        s.model_for("r")
    assert str(exc.value) == message


def test_unseen_robot_is_routed_to_the_cluster_with_most_positive_weight_members():
    # Cluster 0 has three zero-weight listings (IFCA style) but only one real member; an
    # assignment to a cluster that no longer exists is ignored; ties go to the lower id.
    assign = {
        "a": [(0, 0.0), (1, 1.0)],
        "b": [(0, 0.0), (1, 1.0)],
        "c": [(0, 0.0), (2, 1.0)],
        "d": [(0, 1.0)],
        "e": [(2, 1.0)],
        "gone": [(9, 1.0)],
    }
    models = {0: np.zeros(P), 1: np.ones(P), 2: np.full(P, 2.0)}
    s = _loaded(models, assign)
    assert s.route(ClientDescriptor("new", "update")) == [(1, 1.0)]
    np.testing.assert_array_equal(flatten(s.model_for("stranger")), np.ones(P, np.float32))
    ins = s.configure_round(4, ["new", "a"])
    assert ins["new"].membership == [(1, 1.0)] and ins["a"].membership == [(0, 0.0), (1, 1.0)]
    assert s.state()[1]["assignments"]["new"] == [[1, 1.0]]  # the newcomer is remembered
    s2 = _loaded(models, {"a": [(2, 1.0)], "b": [(0, 1.0)], "c": [(2, 1.0)], "d": [(0, 1.0)]})
    assert s2.route(ClientDescriptor("new", "update")) == [(0, 1.0)]
    assert _loaded(models, {}).route(ClientDescriptor("new", "update")) == [(0, 1.0)]


def test_routing_without_any_cluster_is_refused_naming_the_strategy():
    s = make_strategy("local")
    s.initialize(INIT, [])
    assert s.cluster_ids() == []
    with pytest.raises(ValueError, match=r"^local: no cluster models yet$"):
        Strategy.route(s, ClientDescriptor("x", "update"))
    s2 = _loaded({}, {})
    with pytest.raises(ValueError, match=r"^fedavg: no cluster models yet$"):
        s2.model_for("x")


def test_strategy_never_initialized_has_no_clusters_and_says_so():
    s = make_strategy("fedavg")
    assert s.cluster_ids() == []
    with pytest.raises(ValueError, match=r"^fedavg: no cluster models yet$"):
        s.route(ClientDescriptor("x", "update"))


def test_unseen_robot_without_a_descriptor_goes_through_the_strategys_own_router():
    # FeDepth routes by Gaussian descriptor; a robot first seen in configure_round (no
    # descriptor yet) falls back to the largest cluster.
    s = make_strategy("fedepth")
    s.initialize(INIT, ["a", "b"])
    assert s.configure_round(0, ["late"])["late"].membership == [(0, 1.0)]
    np.testing.assert_array_equal(flatten(s.model_for("stranger")), flatten(INIT))


def test_configure_round_instructs_exactly_the_given_robots_with_copies():
    s = _fedavg(["a", "b"], lr=0.01, local_steps=5, local_epochs=2)
    ins = s.configure_round(2, ["b"])
    assert list(ins) == ["b"]
    assert ins["b"] == RobotInstruction(
        [(0, 1.0)], RoundConfig(local_epochs=2, local_steps=5, lr=0.01)
    )
    ins["b"].membership.append((7, 1.0))  # the caller's copy, not the strategy's
    assert s.configure_round(3, ["b"])["b"].membership == [(0, 1.0)]


# --------------------------------------------------------------------------- round config


def test_round_config_defaults_and_training_settings():
    assert _fedavg().round_config(0) == RoundConfig()
    cfg = make_strategy("fedavg", lr=3e-4, local_steps=12, local_epochs=3).round_config(5)
    assert (
        cfg.lr,
        cfg.local_steps,
        cfg.local_epochs,
        cfg.descriptor_kind,
        cfg.pick_cluster,
        cfg.prox_mu,
    ) == (3e-4, 12, 3, "gaussian", False, 0.0)
    assert make_strategy("ifca").round_config(0) == RoundConfig(pick_cluster=True)
    assert make_strategy("rnd").round_config(0).descriptor_kind == "rnd"
    assert make_strategy("fedavg").needs_descriptors(0) == set()


@pytest.mark.parametrize(
    "kw,message",
    [
        ({"local_epochs": 0}, "round config local_epochs must be an int >= 1, got 0"),
        ({"local_steps": 0}, "round config local_steps must be an int >= 1, got 0"),
        ({"lr": 0.0}, "round config lr must be > 0, got 0.0"),
        ({"lr": float("nan")}, "round config lr must be a finite number, got nan"),
    ],
)
def test_bad_training_settings_are_refused_at_construction(kw, message):
    with pytest.raises(ValueError) as exc:
        make_strategy("fedavg", **kw)
    assert str(exc.value) == message


# ---------------------------------------------------------------------------- make_strategy


def test_every_registered_strategy_is_built_by_name_case_insensitively():
    assert sorted(STRATEGIES) == [
        "fedavg",
        "feddrman",
        "fedepth",
        "fedprox",
        "ifca",
        "local",
        "rnd",
    ]
    for key in STRATEGIES:
        s = make_strategy(key.upper())
        assert isinstance(s, Strategy) and s.name == key


def test_unknown_strategy_name_lists_the_choices():
    with pytest.raises(ValueError) as exc:
        make_strategy("fedsgd")
    assert str(exc.value) == (
        "unknown strategy 'fedsgd'; choose from "
        "['fedavg', 'feddrman', 'fedepth', 'fedprox', 'ifca', 'local', 'rnd']"
    )


def test_unknown_setting_lists_the_settings_the_strategy_and_its_bases_accept():
    with pytest.raises(ValueError) as exc:
        make_strategy("FedProx", mu=0.1, gamma=1, alpha=2)
    assert str(exc.value) == (
        "strategy 'fedprox' does not take setting(s) ['alpha', 'gamma']; accepted: "
        "['local_epochs', 'local_steps', 'lr', 'mu', 'robust', 'robust_kwargs', 'stack_updates']"
    )


def test_settings_reach_the_strategy():
    s = make_strategy("fedprox", mu=0.25, robust="median", lr=0.5, local_steps=3)
    assert (s.mu, s.robust, s.lr, s.local_steps) == (0.25, "median", 0.5, 3)
    assert s.round_config(0).prox_mu == 0.25


# ------------------------------------------------------------------------------ persistence


def test_state_holds_theta0_every_cluster_and_the_assignments():
    s = make_strategy("ifca", num_clusters=2)
    s.initialize(INIT, ["a", "b"])
    s.aggregate_round(0, [_up("a", np.full(P, 3.0), cluster_id=1)], {})
    arrays, meta = s.state()
    assert list(arrays) == ["theta0", "cluster/0", "cluster/1"]
    np.testing.assert_array_equal(arrays["theta0"], flatten(INIT))
    np.testing.assert_array_equal(arrays["cluster/1"], np.full(P, 3.0, np.float32))
    assert meta == {
        "name": "ifca",
        "manifest": manifest_to_json(MAN),
        "extra": {},
        "assignments": {"a": [[0, 0.0], [1, 1.0]], "b": [[0, 1.0], [1, 0.0]]},
    }


def test_load_state_restores_models_ids_and_memberships_as_readonly_copies():
    c5, c2 = np.full(P, 5.0, np.float32), np.arange(P, dtype=np.float32)
    arrays, meta = _state("fedavg", {5: c5, 2: c2}, {"r": [(5, 1.0)], "q": [(2, 0.5), (5, 0.5)]})
    del meta["extra"]  # optional
    s = make_strategy("fedavg")
    s.load_state(arrays, meta)
    c5[:] = -1.0  # the loader's arrays may be reused
    assert s.cluster_ids() == [2, 5] and list(s.cluster_models()) == [2, 5] and s.manifest == MAN
    np.testing.assert_array_equal(flatten(s.model_for("r")), np.full(P, 5.0, np.float32))
    np.testing.assert_allclose(flatten(s.model_for("q")), (np.arange(P) + 5.0) / 2, rtol=1e-6)
    assert not s.cluster_models()[5]["w"].flags.writeable
    assert s.configure_round(0, ["q"])["q"].membership == [(2, 0.5), (5, 0.5)]


@pytest.mark.parametrize(
    "edit,message",
    [
        (lambda a, m: m.update(name="ifca"), "state is for strategy 'ifca', not 'fedavg'"),
        (lambda a, m: m.pop("name"), "state is for strategy None, not 'fedavg'"),
        (lambda a, m: m.pop("manifest"), "malformed strategy state ('manifest')"),
        (lambda a, m: m.pop("assignments"), "malformed strategy state ('assignments')"),
        (lambda a, m: a.pop("theta0"), "malformed strategy state ('theta0')"),
        (
            lambda a, m: a.update({"cluster/x": np.zeros(P)}),
            "malformed strategy state (invalid literal for int() with base 10: 'x')",
        ),
        (
            lambda a, m: a.update(
                {"cluster/1/2": np.full(P, 9.0)}
            ),  # must not pass for cluster 1 or 2
            "malformed strategy state (invalid literal for int() with base 10: '1/2')",
        ),
        (
            lambda a, m: m.update(assignments={"r": [[0]]}),
            "malformed strategy state (not enough values to unpack (expected 2, got 1))",
        ),
        (
            lambda a, m: a.update({"cluster/1": np.zeros(P + 1)}),
            "state array for cluster 1 has shape (8,), expected (7,)",
        ),
        (
            lambda a, m: a.update(theta0=np.zeros((1, P))),
            "state array for cluster -1 has shape (1, 7), expected (7,)",
        ),
        (
            lambda a, m: a.update({"cluster/3": np.full(P, np.nan)}),
            "state array for cluster 3 holds NaN/Inf values",
        ),
        (
            lambda a, m: a.update(theta0=np.full(P, np.inf)),
            "state array for cluster -1 holds NaN/Inf values",
        ),
    ],
)
def test_malformed_state_is_refused_and_leaves_the_strategy_as_it_was(edit, message):
    s = _fedavg(["a"])
    s.aggregate_round(0, [_up("a", np.full(P, 4.0))], {})
    arrays, meta = _state("fedavg", {0: np.zeros(P), 1: np.ones(P)}, {"a": [(1, 1.0)]})
    edit(arrays, meta)
    with pytest.raises(ValueError) as exc:
        s.load_state(arrays, meta)
    assert str(exc.value) == message
    np.testing.assert_array_equal(flatten(s.model_for("a")), np.full(P, 4.0, np.float32))
    assert s.cluster_ids() == [0]


def test_load_state_converts_arrays_to_float32_models():
    arrays, meta = _state("fedavg", {}, {"soft": [(0, 1.0), (1, 1.0)], "one": [(1, 1.0)]})
    arrays.update(
        {
            "theta0": flatten(INIT).astype(np.float64),
            "cluster/0": np.full(P, 2.0),
            "cluster/1": [4.0] * P,
        }
    )
    s = make_strategy("fedavg")
    s.load_state(arrays, meta)
    for rid, value in (("soft", 3.0), ("one", 4.0)):
        got = s.model_for(rid)
        assert all(v.dtype == np.float32 for v in got.values())
        np.testing.assert_array_equal(flatten(got), np.full(P, value, np.float32))
    assert s.state()[0]["theta0"].dtype == np.float32
    np.testing.assert_array_equal(s.state()[0]["theta0"], flatten(INIT))


def test_state_round_trip_through_the_store_continues_bit_identically(tmp_path):
    from fed_ros.core.rounds.store import ModelStore

    a = make_strategy("ifca", num_clusters=2)
    a.initialize(INIT, ["r0", "r1", "r2"])
    a.aggregate_round(
        0, [_up("r0", np.full(P, 2.0), 2, cluster_id=1), _up("r1", np.ones(P), 1, cluster_id=0)], {}
    )
    store = ModelStore(tmp_path)
    store.commit(0, a.cluster_models(), a.state()[1]["assignments"], a.state(), {})
    b = make_strategy("ifca", num_clusters=2)
    b.load_state(*store.load_latest().strategy_state)
    nxt = [
        _up("r2", np.full(P, 7.0), 3, base_round=1, cluster_id=1),
        _up("r0", np.full(P, -1.0), 1, 1, 1),
    ]
    ra, rb = a.aggregate_round(1, nxt, {}), b.aggregate_round(1, nxt, {})
    assert ra.assignments == rb.assignments
    for c in ra.cluster_models:
        np.testing.assert_array_equal(flatten(ra.cluster_models[c]), flatten(rb.cluster_models[c]))


def test_result_assignments_are_copies():
    s = _fedavg(["a"])
    res = s.aggregate_round(0, [_up("a", np.ones(P))], {})
    res.assignments["a"].append((3, 1.0))
    assert s.configure_round(1, ["a"])["a"].membership == [(0, 1.0)]
    assert isinstance(res, RoundResult)


# ----------------------------------------------------------------------- stable cluster ids


def test_match_cluster_ids_keeps_ids_of_groups_that_keep_their_members():
    prev = {"a": 5, "b": 5, "c": 2, "d": 2, "e": 2}
    assert match_cluster_ids([["a", "b"], ["c", "d", "e"]], prev, [2, 5]) == [5, 2]
    assert match_cluster_ids([["c", "d", "e"], ["a", "b"]], prev, [5, 2]) == [2, 5]
    # Majority wins: the group with two of cluster 2's robots keeps 2.
    assert match_cluster_ids([["a", "c"], ["d", "e", "b"]], prev, [2, 5]) == [5, 2]


def test_match_cluster_ids_gives_new_groups_fresh_ids_above_all_known():
    prev = {"a": 1, "b": 4}
    assert match_cluster_ids([["x"], ["a"], ["y"], ["b"]], prev, [4, 1]) == [5, 1, 6, 4]
    assert match_cluster_ids([["a"], ["b"], ["c"]], {}, []) == [0, 1, 2]
    assert match_cluster_ids([], prev, [1, 4]) == []
    # More known clusters than groups: unmatched ids are simply unused.
    assert match_cluster_ids([["b"]], prev, [1, 4, 7]) == [4]


def test_match_cluster_ids_breaks_ties_towards_lower_ids_and_earlier_groups():
    # Fewer groups than ids: an unmatched group takes the lowest free id.
    assert match_cluster_ids([["x"]], {}, [7, 3]) == [3]
    assert match_cluster_ids([["x"]], {"x": 9}, [np.int64(7), 3, 7]) == [3]  # 9 is not available
    assert match_cluster_ids([["x"], ["b"]], {"b": 3}, [7, 3, 5]) == [5, 3]
    # More groups than ids, equal overlap: the earlier group keeps the id, the later gets a fresh
    # one.
    assert match_cluster_ids([["a"], ["b"]], {"a": 3, "b": 3}, [3]) == [3, 4]
    assert match_cluster_ids([["a"], ["b"], ["c"]], {"c": 3}, [3]) == [4, 5, 3]


@settings(max_examples=60, deadline=None)
@given(st.data())
def test_match_cluster_ids_is_injective_and_stable_for_unchanged_groups(data):
    robots = [f"r{i}" for i in range(data.draw(st.integers(1, 10)))]
    labels = data.draw(st.lists(st.integers(0, 3), min_size=len(robots), max_size=len(robots)))
    groups = [[r for r, g in zip(robots, labels) if g == k] for k in sorted(set(labels))]
    old_ids = data.draw(
        st.lists(st.integers(0, 50), min_size=len(groups), max_size=len(groups), unique=True)
    )
    prev = {r: old_ids[k] for k, g in enumerate(groups) for r in g}
    order = data.draw(st.permutations(range(len(groups))))
    shuffled = [groups[k] for k in order]
    assert match_cluster_ids(shuffled, prev, old_ids) == [old_ids[k] for k in order]
    extra = data.draw(st.lists(st.integers(0, 60), max_size=4))
    ids = match_cluster_ids(shuffled + [["new"]], prev, old_ids + extra)
    assert len(set(ids)) == len(ids)
    assert ids[: len(groups)] == [old_ids[k] for k in order]
    assert ids[-1] in set(old_ids + extra) or ids[-1] == max(old_ids + extra) + 1


# --------------------------------------------------------------------------- strategy_types


def test_client_update_accepts_boundary_values_and_defaults():
    u = ClientUpdate("r", _sd(np.ones(P)), 0, 0)
    assert (u.cluster_id, u.metrics) == (-1, {})
    u.metrics["loss"] = 1.0
    assert ClientUpdate("q", _sd(np.ones(P)), np.int64(3), np.int32(2), np.int64(0)).metrics == {}
    assert ClientUpdate("q", _sd(np.ones(P)), 5, 1, 4).cluster_id == 4


@pytest.mark.parametrize(
    "args,message",
    [
        (("", 1, 0, -1), "robot_id must be a non-empty string, got ''"),
        ((None, 1, 0, -1), "robot_id must be a non-empty string, got None"),
        (("r", -1, 0, -1), "num_samples of 'r' is -1; must be an int >= 0"),
        (("r", True, 0, -1), "num_samples of 'r' is True; must be an int >= 0"),
        (("r", 2.0, 0, -1), "num_samples of 'r' is 2.0; must be an int >= 0"),
        (("r", 1, -1, -1), "base_round of 'r' is -1; must be an int >= 0"),
        (("r", 1, 1.0, -1), "base_round of 'r' is 1.0; must be an int >= 0"),
        (("r", 1, 0, -2), "cluster_id of 'r' is -2; must be an int >= -1"),
        (("r", 1, 0, 0.0), "cluster_id of 'r' is 0.0; must be an int >= -1"),
    ],
)
def test_client_update_refuses_bad_fields_naming_robot_and_value(args, message):
    rid, n, base, cid = args
    with pytest.raises(ValueError) as exc:
        ClientUpdate(rid, _sd(np.ones(P)), n, base, cid)
    assert str(exc.value) == message


def test_client_update_refuses_params_that_are_not_a_state_dict():
    with pytest.raises(ValueError, match=r"^params of 'r' must be a state dict$"):
        ClientUpdate("r", [np.ones(3)], 1, 0)


def test_descriptor_kinds_and_the_kinds_that_need_no_payload():
    assert DESCRIPTOR_KINDS == ("gaussian", "rnd", "update", "embedding")
    for kind in ("update", "embedding"):
        d = ClientDescriptor("r", kind)
        assert (d.mean, d.variance, d.num_samples, d.scores, d.payload) == (None, None, 0, {}, b"")
        assert math.isnan(d.residual_std)
    g = ClientDescriptor(
        "r", "gaussian", mean=[0.0, 1.0], variance=[1e-12, 2.0], num_samples=np.int64(4)
    )
    assert g.num_samples == 4
    rnd = ClientDescriptor("r", "rnd", scores={"p": 0.0, "q": 2.5}, residual_std=0.0)
    assert rnd.scores == {"p": 0.0, "q": 2.5}


@pytest.mark.parametrize(
    "kw,message",
    [
        (
            dict(robot_id="", kind="update"),
            "descriptor robot_id must be a non-empty string, got ''",
        ),
        (dict(robot_id=3, kind="update"), "descriptor robot_id must be a non-empty string, got 3"),
        (
            dict(kind="hist"),
            "descriptor kind 'hist' not in ('gaussian', 'rnd', 'update', 'embedding')",
        ),
        (dict(kind="update", num_samples=-1), "descriptor num_samples of 'r' is -1; must be >= 0"),
        (
            dict(kind="update", num_samples=1.5),
            "descriptor num_samples of 'r' is 1.5; must be >= 0",
        ),
        (dict(kind="gaussian", mean=[1.0]), "gaussian descriptor of 'r' needs mean and variance"),
        (
            dict(kind="gaussian", variance=[1.0]),
            "gaussian descriptor of 'r' needs mean and variance",
        ),
        (
            dict(kind="gaussian", mean=[[1.0]], variance=[[1.0]]),
            "gaussian descriptor of 'r': mean (1, 1) / variance (1, 1) must be equal-length 1-D",
        ),
        (
            dict(kind="gaussian", mean=[1.0, 2.0], variance=[1.0]),
            "gaussian descriptor of 'r': mean (2,) / variance (1,) must be equal-length 1-D",
        ),
        (
            dict(kind="gaussian", mean=[], variance=[]),
            "gaussian descriptor of 'r': mean (0,) / variance (0,) must be equal-length 1-D",
        ),
        (
            dict(kind="gaussian", mean=[np.nan], variance=[1.0]),
            "gaussian descriptor of 'r' holds NaN/Inf",
        ),
        (
            dict(kind="gaussian", mean=[0.0], variance=[np.inf]),
            "gaussian descriptor of 'r' holds NaN/Inf",
        ),
        (
            dict(kind="gaussian", mean=[0.0, 0.0], variance=[1.0, 0.0]),
            "gaussian descriptor of 'r' has variance <= 0",
        ),
        (
            dict(kind="gaussian", mean=[0.0], variance=[-1.0]),
            "gaussian descriptor of 'r' has variance <= 0",
        ),
        (
            dict(kind="rnd", scores={"p": -0.5}, residual_std=0.1),
            "rnd descriptor of 'r': score for 'p' is -0.5; must be finite and >= 0",
        ),
        (
            dict(kind="rnd", scores={"p": 1.0, "q": float("inf")}, residual_std=0.1),
            "rnd descriptor of 'r': score for 'q' is inf; must be finite and >= 0",
        ),
        (
            dict(kind="rnd", scores={4: 1.0}, residual_std=0.1),
            "rnd descriptor of 'r': score for 4 is 1.0; must be finite and >= 0",
        ),
        (
            dict(kind="rnd", scores={}),
            "rnd descriptor of 'r': residual_std nan must be finite and >= 0",
        ),
        (
            dict(kind="rnd", residual_std=-0.1),
            "rnd descriptor of 'r': residual_std -0.1 must be finite and >= 0",
        ),
    ],
)
def test_client_descriptor_refuses_bad_fields_naming_robot_and_value(kw, message):
    kw = {"robot_id": "r", **kw}
    with pytest.raises(ValueError) as exc:
        ClientDescriptor(**kw)
    assert str(exc.value) == message


def test_round_result_carries_models_assignments_and_diagnostics():
    r = RoundResult({0: INIT}, {"a": [(0, 1.0)]}, {"round": 1})
    assert (r.cluster_models, r.assignments, r.diagnostics) == (
        {0: INIT},
        {"a": [(0, 1.0)]},
        {"round": 1},
    )
