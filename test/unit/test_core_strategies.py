"""Strategies end to end on synthetic fleets: FedDRMan, FeDepth, RND, IFCA, FedAvg/FedProx,
Local."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fed_ros.core.params import flatten, manifest_of, unflatten
from fed_ros.core.clustering.srb import srb_block
from fed_ros.core.strategies.ifca import ifca_select
from fed_ros.core.strategies.base import make_strategy
from fed_ros.core.strategies.types import ClientDescriptor, ClientUpdate


def _initial(seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {
        "encoder.w": rng.normal(size=(6, 5)).astype(np.float32),
        "temporal.w": rng.normal(size=(8, 8)).astype(np.float32),
        "temporal.b": rng.normal(size=8).astype(np.float32),
        "head.w": rng.normal(size=(4, 8)).astype(np.float32),
    }


def _fleet_updates(init, ids, round_idx, groups=2, seed=0, noise=0.05):
    """Robot i moves theta^0 along direction i % groups (+ noise): a clustered fleet."""
    man = manifest_of(init)
    th = flatten(init)
    rng = np.random.default_rng(seed)
    dirs = np.random.default_rng(99).normal(size=(groups, th.size)).astype(np.float32)
    out = []
    for i, rid in enumerate(ids):
        vec = th + dirs[i % groups] + noise * rng.normal(size=th.size).astype(np.float32)
        out.append(
            ClientUpdate(rid, unflatten(vec.astype(np.float32), man, copy=True), 10 + i, round_idx)
        )
    return out


IDS = [f"robot_{i}" for i in range(6)]


def test_make_strategy_rejects_unknown_names_and_settings():
    with pytest.raises(ValueError, match="nope"):
        make_strategy("nope")
    with pytest.raises(ValueError, match="bogus"):
        make_strategy("feddrman", bogus=1)
    with pytest.raises(ValueError, match="beta"):
        make_strategy("feddrman", beta=1.5)
    assert make_strategy("fedprox").round_config(0).prox_mu == 1e-3
    with pytest.raises(ValueError, match="local_steps must be an int >= 1, got 0"):
        make_strategy("fedavg", local_steps=0)


@pytest.mark.parametrize(
    "name,kw,expected",
    [
        (
            "fedavg",
            {},
            dict(
                prox_mu=0.0,
                use_sub=False,
                use_act=False,
                descriptor_kind="gaussian",
                pick_cluster=False,
            ),
        ),
        ("fedprox", {"mu": 0.05}, dict(prox_mu=0.05, use_sub=False, use_act=False)),
        (
            "feddrman",
            {},
            dict(prox_mu=0.0, use_sub=True, use_act=True, lambda_sub=0.03, lambda_act=0.005),
        ),
        (
            "feddrman",
            {"use_sub": False, "lambda_act": 0.01},
            dict(use_sub=False, use_act=True, lambda_act=0.01),
        ),
        ("ifca", {"num_clusters": 2}, dict(pick_cluster=True, use_sub=False)),
        ("fedepth", {}, dict(descriptor_kind="gaussian")),
        ("rnd", {}, dict(descriptor_kind="rnd")),
        ("local", {"lr": 3e-3, "local_steps": 20}, dict(lr=3e-3, local_steps=20, local_epochs=1)),
    ],
)
def test_configure_round_gives_every_robot_membership_and_the_strategys_round_config(
    name, kw, expected
):
    s = make_strategy(name, **kw)
    s.initialize(_initial(), IDS)
    instructions = s.configure_round(0, IDS)
    assert sorted(instructions) == sorted(IDS)
    for rid, ins in instructions.items():
        assert ins.membership and ins.config == s.round_config(0)
        assert {k: getattr(ins.config, k) for k in expected} == expected, (name, rid)


def test_feddrman_clusters_and_keeps_ids_stable_across_rounds():
    init = _initial()
    s = make_strategy("feddrman", num_clusters=2)
    s.initialize(init, IDS)
    res0 = s.aggregate_round(0, _fleet_updates(init, IDS, 0, seed=1), {})
    groups0 = res0.diagnostics["groups"]
    assert sorted(sorted(g) for g in groups0.values()) == [IDS[0::2], IDS[1::2]]
    # Same fleet, updates arriving in another order: same cluster ids for the same robots.
    ups = _fleet_updates(init, IDS, 1, seed=2)[::-1]
    res1 = s.aggregate_round(1, ups, {})
    assert {c: sorted(g) for c, g in res1.diagnostics["groups"].items()} == {
        c: sorted(g) for c, g in groups0.items()
    }
    for rid in IDS:
        assert res1.assignments[rid] == res0.assignments[rid]
    assert set(res1.cluster_models) == {0, 1}


def test_feddrman_persistent_update_with_and_without_srb():
    init = _initial()
    ids = IDS[:4]
    ups = _fleet_updates(init, ids, 0, groups=1, seed=3)
    man = manifest_of(init)
    n = np.array([u.num_samples for u in ups], dtype=np.float64)
    avg = sum((w / n.sum()) * flatten(u.params).astype(np.float64) for w, u in zip(n, ups))
    plain = make_strategy("feddrman", num_clusters=1, use_srb=False)
    plain.initialize(init, ids)
    out = plain.aggregate_round(0, ups, {}).cluster_models[0]
    np.testing.assert_allclose(flatten(out), avg, rtol=1e-5, atol=1e-5)
    srb = make_strategy("feddrman", num_clusters=1, beta=0.9)
    srb.initialize(init, ids)
    res = srb.aggregate_round(0, ups, {})
    delta = unflatten((avg - flatten(init)).astype(np.float32), man, copy=True)
    for name in ("encoder.w", "temporal.w", "head.w"):  # eligible 2-D blocks
        expected = init[name] + srb_block(delta[name], 0.9)[0]
        np.testing.assert_allclose(res.cluster_models[0][name], expected, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(
        res.cluster_models[0]["temporal.b"],
        init["temporal.b"] + delta["temporal.b"],
        rtol=1e-5,
        atol=1e-5,
    )  # 1-D: keeps the averaged update
    assert set(res.diagnostics["srb"]["0"]) == {"encoder.w", "temporal.w", "head.w"}


def test_feddrman_bad_inputs_raise_named_errors():
    init = _initial()
    s = make_strategy("feddrman", num_clusters=3)
    s.initialize(init, IDS)
    with pytest.raises(ValueError, match="K=2.*C=3"):
        s.aggregate_round(0, _fleet_updates(init, IDS[:2], 0), {})
    ups = _fleet_updates(init, IDS, 0)
    ups[3].params["head.w"][0, 0] = np.nan
    with pytest.raises(ValueError, match="robot_3"):
        s.aggregate_round(0, ups, {})
    ups = _fleet_updates(init, IDS, 0)
    ups[1].params["temporal.w"] = np.zeros((8, 7), np.float32)
    with pytest.raises(ValueError, match="robot_1.*temporal.w"):
        s.aggregate_round(0, ups, {})
    with pytest.raises(ValueError, match="-1"):
        ClientUpdate("r", init, -1, 0)


def test_feddrman_omega_fallback_warns_and_ablation_single_cluster():
    init = _initial()
    with pytest.warns(RuntimeWarning, match="omega_prefixes"):
        s = make_strategy("feddrman", num_clusters=2, omega_prefixes=("transformer.",))
        s.initialize(init, IDS)
    res = s.aggregate_round(0, _fleet_updates(init, IDS, 0), {})
    assert res.diagnostics["omega"] == "all" and len(res.diagnostics["groups"]) == 2
    ab = make_strategy("feddrman", num_clusters=2, use_cua=False)
    ab.initialize(init, IDS)
    assert len(ab.aggregate_round(0, _fleet_updates(init, IDS, 0), {}).cluster_models) == 1


@settings(max_examples=8, deadline=None)
@given(seed=st.integers(0, 1000), name=st.sampled_from(["fedavg", "feddrman", "rnd"]))
def test_aggregation_is_bit_identical_for_any_arrival_order(seed, name):
    init = _initial()
    ups = _fleet_updates(init, IDS, 0, seed=seed)
    perm = np.random.default_rng(seed).permutation(len(ups))
    desc = {
        r: ClientDescriptor(r, "rnd", scores={p: 1.0 for p in IDS}, residual_std=0.1) for r in IDS
    }
    outs = []
    for order in (range(len(ups)), perm):
        s = make_strategy(name, **({"num_clusters": 2} if name == "feddrman" else {}))
        s.initialize(init, IDS)
        outs.append(s.aggregate_round(0, [ups[i] for i in order], desc).cluster_models)
    assert outs[0].keys() == outs[1].keys()
    for c in outs[0]:
        for k in init:
            assert np.array_equal(outs[0][c][k], outs[1][c][k])


@pytest.mark.parametrize(
    "name,kw", [("fedavg", {}), ("fedepth", {"tau": 100.0}), ("feddrman", {"num_clusters": 2})]
)
def test_recycled_average_buffers_never_touch_models_still_held(name, kw):
    init = _initial()
    desc = _gaussians(IDS)
    keeper, recycler = make_strategy(name, **kw), make_strategy(name, **kw)
    keeper.initialize(init, IDS)
    recycler.initialize(init, IDS)
    take, reused = recycler._spare_buffer, []

    def counting_take(shape):
        buf = take(shape)
        reused.append(buf is not None)  # a bool: holding the buffer would block its reuse
        return buf

    recycler._spare_buffer = counting_take

    def assert_same(a, b):
        for c, sd in b.items():
            for k, v in sd.items():
                np.testing.assert_array_equal(a[c][k], v)

    held, snapshots = [], []
    for r in range(8):
        ups = _fleet_updates(init, IDS, r, seed=r)
        kept = keeper.aggregate_round(r, ups, desc).cluster_models  # every result held
        res = recycler.aggregate_round(r, ups, desc).cluster_models  # odd rounds dropped
        assert_same(res, kept)  # same bits either way
        if r % 2 == 0:
            held.append(res)
            snapshots.append({c: {k: v.copy() for k, v in sd.items()} for c, sd in res.items()})
        del res
    for res, snap in zip(held, snapshots):  # held results never change
        assert_same(snap, res)
    assert sum(reused) >= 3  # the dropped (odd) rounds' buffers were reused


def test_fedavg_of_identical_updates_is_that_model_for_every_strategy():
    init = _initial()
    same = {k: v + 1.0 for k, v in init.items()}
    for name, kw in [
        ("fedavg", {}),
        ("fedprox", {}),
        ("feddrman", {"num_clusters": 1, "use_srb": False}),
        ("fedavg", {"robust": "median"}),
        ("fedavg", {"robust": "trimmed_mean"}),
    ]:
        s = make_strategy(name, **kw)
        s.initialize(init, IDS)
        ups = [
            ClientUpdate(r, {k: v.copy() for k, v in same.items()}, 5 + i, 0)
            for i, r in enumerate(IDS)
        ]
        out = s.aggregate_round(0, ups, {}).cluster_models[0]
        for k in init:
            np.testing.assert_allclose(out[k], same[k], rtol=1e-6, atol=1e-6)


def test_ifca_select_and_per_cluster_aggregation():
    assert ifca_select([0.5, 0.2, 0.2]) == 1
    with pytest.raises(ValueError, match="non-finite"):
        ifca_select([0.1, float("nan")])
    init = _initial()
    s = make_strategy("ifca", num_clusters=3)
    s.initialize(init, IDS)
    assert s.client_selects_cluster
    cfg = s.configure_round(0, IDS)
    assert (
        cfg["robot_0"].membership == [(0, 1.0), (1, 0.0), (2, 0.0)]
        and cfg["robot_0"].config.pick_cluster
    )
    models_before = s.cluster_models()
    assert not np.array_equal(models_before[0]["head.w"], models_before[1]["head.w"])
    ups = _fleet_updates(init, IDS, 0)
    for i, u in enumerate(ups):
        u.cluster_id = i % 2
    res = s.aggregate_round(0, ups, {})
    np.testing.assert_array_equal(
        res.cluster_models[2]["head.w"], models_before[2]["head.w"]
    )  # nobody chose 2
    n = np.array([u.num_samples for u in ups[0::2]], dtype=np.float64)
    expected = sum(
        w / n.sum() * u.params["head.w"].astype(np.float64) for w, u in zip(n, ups[0::2])
    )
    np.testing.assert_allclose(res.cluster_models[0]["head.w"], expected, rtol=1e-5, atol=1e-5)
    assert res.assignments["robot_1"] == [(0, 0.0), (1, 1.0), (2, 0.0)]
    np.testing.assert_array_equal(s.model_for("robot_1")["head.w"], res.cluster_models[1]["head.w"])
    ups[0].cluster_id = 7
    with pytest.raises(ValueError, match="robot_0.*7"):
        s.aggregate_round(1, ups, {})


def _gaussians(ids, seed=0):
    rng = np.random.default_rng(seed)
    return {
        r: ClientDescriptor(
            r,
            "gaussian",
            mean=np.full(4, 3.0 * (i % 2)) + 0.2 * rng.normal(size=4),
            variance=np.ones(4),
            num_samples=10,
        )
        for i, r in enumerate(ids)
    }


def test_fedepth_multi_membership_and_routing():
    init = _initial()
    s = make_strategy("fedepth", target_overlap=0.2)
    s.initialize(init, IDS)
    assert s.needs_descriptors(0) == {"gaussian"}
    with pytest.raises(ValueError, match="gaussian descriptor"):
        s.aggregate_round(0, _fleet_updates(init, IDS, 0), {})
    res = s.aggregate_round(0, _fleet_updates(init, IDS, 0), _gaussians(IDS))
    assert s.needs_descriptors(1) == set()
    for rid, mem in res.assignments.items():
        assert sum(w for _, w in mem) == pytest.approx(1.0)
        mean = np.mean([flatten(res.cluster_models[c]) for c, _ in mem], axis=0)
        np.testing.assert_allclose(flatten(s.model_for(rid)), mean, rtol=1e-5, atol=1e-6)
    new = ClientDescriptor("newbie", "gaussian", mean=np.full(4, 3.0), variance=np.ones(4))
    routed = s.route(new)
    members = res.diagnostics["clusters"]
    assert all("robot_1" in members[str(c)] or "robot_3" in members[str(c)] for c, _ in routed)
    hard = make_strategy("fedepth", hard=True, target_overlap=0.0)
    hard.initialize(init, IDS)
    hres = hard.aggregate_round(0, _fleet_updates(init, IDS, 0), _gaussians(IDS))
    assert all(len(m) == 1 for m in hres.assignments.values())


def test_fedepth_calibration_on_twenty_robots_finds_the_two_groups():
    ids = [f"robot_{i:02d}" for i in range(20)]
    init = _initial()
    groups = sorted([ids[0::2], ids[1::2]])
    for hard in (False, True):
        s = make_strategy("fedepth", target_overlap=0.2, hard=hard)
        s.initialize(init, ids)
        res = s.aggregate_round(0, _fleet_updates(init, ids, 0), _gaussians(ids))
        clusters = sorted(sorted(g) for g in res.diagnostics["clusters"].values())
        assert len(clusters) == 2 and res.diagnostics["overlap"] <= 0.2  # was 15 clusters
        if hard:  # same tau, disjoint: exactly the two groups
            assert clusters == groups
        else:  # soft: each cluster is a whole group plus its bridge robots
            assert all(set(g) <= set(c) for g, c in zip(groups, clusters))


def test_rnd_strategy_reclusters_every_tau_rounds():
    init = _initial()
    s = make_strategy("rnd", eps=1.0, recluster_every=2)
    s.initialize(init, IDS)
    desc = {
        r: ClientDescriptor(
            r,
            "rnd",
            scores={p: (1.0 if (i % 2) == (j % 2) else 5.0) for j, p in enumerate(IDS)},
            residual_std=0.1,
        )
        for i, r in enumerate(IDS)
    }
    res = s.aggregate_round(0, _fleet_updates(init, IDS, 0), desc)
    assert sorted(sorted(g) for g in res.diagnostics["federations"].values()) == [
        IDS[0::2],
        IDS[1::2],
    ]
    assert [bool(s.needs_descriptors(r)) for r in (1, 2)] == [False, True]
    res1 = s.aggregate_round(1, _fleet_updates(init, IDS, 1), {})
    assert res1.assignments == res.assignments
    with pytest.raises(ValueError, match="rnd descriptor"):
        s.aggregate_round(2, _fleet_updates(init, IDS, 2), {})
    s.aggregate_round(2, _fleet_updates(init, IDS, 2), desc)
    assert [bool(s.needs_descriptors(r)) for r in (3, 4)] == [False, True]


def test_local_keeps_one_model_per_robot():
    init = _initial()
    s = make_strategy("local")
    s.initialize(init, IDS[:3])
    ups = _fleet_updates(init, IDS[:3], 0)
    res = s.aggregate_round(0, ups, {})
    assert len(res.cluster_models) == 3
    for u in ups:
        cid = res.assignments[u.robot_id][0][0]
        np.testing.assert_array_equal(res.cluster_models[cid]["head.w"], u.params["head.w"])
    u0 = ups[0].params["head.w"].copy()
    ups[0].params["head.w"][:] = 0.0  # the caller reuses its buffer: models must not change
    np.testing.assert_array_equal(s.model_for("robot_0")["head.w"], u0)


@pytest.mark.parametrize(
    "name,kw",
    [
        ("feddrman", {"num_clusters": 2}),
        ("fedepth", {}),
        ("rnd", {}),
        ("ifca", {"num_clusters": 2}),
        ("local", {}),
        ("fedprox", {}),
    ],
)
def test_state_roundtrip_restores_models_and_assignments(name, kw):
    init = _initial()
    s = make_strategy(name, **kw)
    s.initialize(init, IDS)
    desc = dict(_gaussians(IDS))
    if name == "rnd":
        desc = {
            r: ClientDescriptor(r, "rnd", scores={p: 1.0 for p in IDS}, residual_std=0.1)
            for r in IDS
        }
    ups = _fleet_updates(init, IDS, 0)
    for i, u in enumerate(ups):
        u.cluster_id = i % 2
    s.aggregate_round(0, ups, desc)
    arrays, meta = s.state()
    t = make_strategy(name, **kw)
    t.load_state(arrays, meta)
    assert t.configure_round(1, IDS) == s.configure_round(1, IDS)
    for rid in IDS:
        np.testing.assert_array_equal(flatten(t.model_for(rid)), flatten(s.model_for(rid)))
    assert t.needs_descriptors(1) == s.needs_descriptors(1)
    with pytest.raises(ValueError, match="strategy"):
        make_strategy("fedavg").load_state(arrays, meta)
