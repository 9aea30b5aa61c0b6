"""Partitioning toolkit: Dirichlet splits, quantity/feature skew, k-means and diagnostics."""

from __future__ import annotations

import math

import numpy as np
import pytest
from sklearn.cluster import KMeans
from sklearn.metrics import adjusted_rand_score
from sklearn.metrics import silhouette_score as sk_silhouette

from fed_ros.core.data import partition as P
from fed_ros.core.clustering import kmeans as KM


def _blobs(n_per: int = 60, centers: int = 4, dim: int = 5, spread: float = 0.3, seed: int = 0):
    rng = np.random.default_rng(seed)
    means = rng.normal(0, 5, size=(centers, dim))
    x = np.concatenate([m + spread * rng.normal(size=(n_per, dim)) for m in means])
    y = np.repeat(np.arange(centers), n_per)
    return x, y


def test_dirichlet_split_is_disjoint_and_complete():
    tasks = ["lift"] * 40 + ["can"] * 30 + ["stack"] * 30
    part = P.task_split(tasks, num_robots=5, alpha=0.5, seed=3)
    allidx = np.concatenate(part.indices)
    assert len(allidx) == 100 and len(set(allidx.tolist())) == 100
    assert part.sizes().tolist() == [20] * 5
    assert part.counts().sum(0).tolist() == [30, 40, 30]  # can, lift, stack (sorted names)


def test_dirichlet_split_reproducible_by_seed():
    tasks = [f"t{i % 6}" for i in range(300)]
    a = P.task_split(tasks, 4, 0.3, seed=11)
    b = P.task_split(tasks, 4, 0.3, seed=11)
    c = P.task_split(tasks, 4, 0.3, seed=12)
    assert all(np.array_equal(x, y) for x, y in zip(a.indices, b.indices))
    assert not all(np.array_equal(x, y) for x, y in zip(a.indices, c.indices))


def test_dirichlet_proportions_mean_and_concentration():
    rng = np.random.default_rng(0)
    prior = np.array([0.5, 0.3, 0.2])
    q = P.dirichlet_proportions(2.0, prior, 20000, rng)
    assert np.allclose(q.sum(1), 1.0)
    # E[q] = prior; Var[q_c] = p_c (1 - p_c) / (alpha + 1).
    assert np.allclose(q.mean(0), prior, atol=0.01)
    assert np.allclose(q.var(0), prior * (1 - prior) / 3.0, rtol=0.06)
    assert np.array_equal(P.dirichlet_proportions(math.inf, prior, 2, rng), np.tile(prior, (2, 1)))


def test_small_alpha_concentrates_and_large_alpha_is_iid():
    tasks = [f"t{i % 8}" for i in range(1600)]
    skew = P.task_split(tasks, 8, 0.05, seed=0).counts() / 200.0
    iid = P.task_split(tasks, 8, 1000.0, seed=0).counts() / 200.0
    # alpha -> 0: a robot's data is dominated by one group; alpha -> inf: uniform mix.
    assert np.mean(skew.max(1)) > 0.7
    assert np.abs(iid - 1 / 8).max() < 0.06


def test_split_follows_drawn_mixture_when_groups_are_plentiful():
    groups = np.repeat(np.arange(4), 1000)  # plenty of each group
    part = P.dirichlet_split(groups, 4, 1.0, seed=5, sizes=[100] * 4)
    realised = part.counts() / 100.0
    assert np.abs(realised - part.proportions).max() < 0.15


def test_split_validation_errors():
    with pytest.raises(ValueError, match="alpha"):
        P.task_split(["a", "b"], 2, -1.0)
    with pytest.raises(ValueError, match="num_robots"):
        P.task_split(["a", "b"], 3, 1.0)
    with pytest.raises(ValueError, match="sizes"):
        P.task_split(["a", "b", "c"], 2, 1.0, sizes=[2, 2])
    with pytest.raises(ValueError, match="empty"):
        P.task_split([], 1, 1.0)


def test_quantity_skew():
    sizes = P.quantity_skew_sizes(1000, 5, beta=0.5, seed=1, min_size=10)
    assert sizes.sum() == 1000 and sizes.min() >= 10
    assert sizes.max() > 2 * sizes.min()  # skewed
    assert P.quantity_skew_sizes(1000, 4, math.inf).tolist() == [250] * 4
    part = P.quantity_skew_split(100, 3, beta=1.0, seed=2)
    assert sorted(np.concatenate(part.indices).tolist()) == list(range(100))


def test_environment_plan_is_balanced():
    plan = P.environment_plan(6, ["default", "dark"])
    assert plan == ["default", "dark"] * 3
    shuffled = P.environment_plan(6, ["a", "b", "c"], seed=1, shuffle=True)
    assert sorted(shuffled) == sorted(["a", "b", "c"] * 2)
    with pytest.raises(ValueError, match="duplicates"):
        P.environment_plan(2, ["a", "a"])


def test_kmeans_matches_sklearn_inertia_and_recovers_blobs():
    x, y = _blobs()
    ours = KM.kmeans(x, 4, seed=0, n_init=4)
    ref = KMeans(n_clusters=4, n_init=4, random_state=0).fit(x)
    assert ours.inertia == pytest.approx(ref.inertia_, rel=1e-6)
    assert KM.adjusted_rand_index(ours.labels, y) == pytest.approx(1.0)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_ari_matches_sklearn(seed):
    rng = np.random.default_rng(seed)
    a = rng.integers(0, 4, 200)
    b = np.where(rng.random(200) < 0.6, a, rng.integers(0, 5, 200))
    assert KM.adjusted_rand_index(a, b) == pytest.approx(adjusted_rand_score(a, b), abs=1e-12)


def test_ari_hand_computed_and_label_invariance():
    # Classic example: ARI([0,0,1,1],[0,0,1,2]) = 0.5714285714...
    assert KM.adjusted_rand_index([0, 0, 1, 1], [0, 0, 1, 2]) == pytest.approx(4 / 7)
    assert KM.adjusted_rand_index(["x", "x", "y"], [5, 5, 7]) == pytest.approx(1.0)
    with pytest.raises(ValueError, match="lengths"):
        KM.adjusted_rand_index([0, 1], [0])


@pytest.mark.parametrize("k", [2, 3, 6])
def test_silhouette_matches_sklearn(k):
    x, _ = _blobs(n_per=40, centers=3, spread=1.5, seed=k)
    labels = KM.kmeans(x, k, seed=0).labels
    assert KM.silhouette_score(x, labels, chunk=17) == pytest.approx(
        sk_silhouette(x, labels), abs=1e-9
    )


def test_silhouette_singleton_cluster_scores_zero():
    x = np.array([[0.0], [0.1], [5.0]])
    labels = [0, 0, 1]
    assert KM.silhouette_score(x, labels) == pytest.approx(sk_silhouette(x, labels))


def test_silhouette_vs_k_peaks_at_true_k_and_stability():
    x, _ = _blobs(n_per=50, centers=4, spread=0.3)
    curve = KM.silhouette_vs_k(x, [2, 4, 8], seed=0)
    assert max(curve, key=curve.get) == 4
    mean, std = KM.kmeans_stability(x, 4, seeds=[0, 1, 2], n_init=4)
    assert mean == pytest.approx(1.0) and std == pytest.approx(0.0)
    noise = np.random.default_rng(0).normal(size=(200, 3))
    assert KM.kmeans_stability(noise, 8, seeds=[0, 1, 2])[0] < 0.9  # no structure: unstable


def test_embedding_split_uses_clusters_as_groups():
    x, y = _blobs(n_per=50, centers=4)
    part, km = P.embedding_split(x, 4, alpha=0.01, k=4, seed=0)
    assert part.kind == "embedding" and len(part.group_names) == 4
    assert KM.adjusted_rand_index(part.groups, y) == pytest.approx(1.0)
    # Tiny alpha with 4 equal clusters and 4 robots: each robot mostly one cluster.
    assert (part.counts().max(1) / part.sizes()).mean() > 0.7


def test_composition_table_and_manifest():
    part = P.task_split(["a"] * 4 + ["b"] * 4, 2, math.inf, seed=0)
    table = P.composition_table(part, ["r0", "r1"])
    assert table.splitlines()[0] == "| robot | a | b | total |"
    assert table.splitlines()[2].startswith("| r0 |") and table.splitlines()[2].endswith("| 4 |")
    import json

    man = json.loads(P.partition_manifest(part, 1, [f"ep{i}.npz" for i in range(8)]))
    assert len(man["items"]) == 4 and sum(man["groups"].values()) == 4


def _write_demos(root, per_task=6):
    from fed_ros.core.data.episode import ACTION_DIM, Episode

    rng = np.random.default_rng(0)
    root.mkdir(parents=True, exist_ok=True)
    files = []
    dims = {"joint_pos": 7, "gripper_qpos": 2, "eef_pos": 3, "eef_quat": 4, "object_state": 32}
    for task in ("lift", "stack"):
        for i in range(per_task):
            # The two tasks' states sit far apart, so embedding clusters follow the task.
            offset = 0.0 if task == "lift" else 3.0
            obs = {
                k: (offset + rng.normal(size=(5, d))).astype(np.float32) for k, d in dims.items()
            }
            ep = Episode(
                task=task,
                instruction=f"do {task}",
                variation="default" if i % 2 else "dim_light",
                observations=obs,
                actions=rng.uniform(-1, 1, size=(5, ACTION_DIM)),
                success=i != 0,
            )
            files.append(ep.save(root / f"{task}_{i:02d}.npz"))
    return files


def test_partition_cli_writes_manifests(tmp_path, capsys):
    import json
    from fed_ros.commands.partition import main

    _write_demos(tmp_path / "demos")
    rc = main(
        [
            str(tmp_path / "demos"),
            "--robots",
            "2",
            "--alpha",
            "0.5",
            "--by",
            "task",
            "--out",
            str(tmp_path / "parts"),
            "--seed",
            "4",
        ]
    )
    assert rc == 0
    out = capsys.readouterr().out
    assert "| robot | lift | stack | total |" in out
    mans = [json.loads((tmp_path / "parts" / f"robot_{n}.json").read_text()) for n in range(2)]
    items = mans[0]["items"] + mans[1]["items"]
    # Failed demos (index 0 of each task) are excluded; the rest are split disjointly.
    assert sorted(items) == sorted(
        f"{t}_{i:02d}.npz" for t in ("lift", "stack") for i in range(1, 6)
    )
    summary = json.loads((tmp_path / "parts" / "partition.json").read_text())
    assert summary["group_names"] == ["lift", "stack"] and summary["alpha"] == 0.5


def test_partition_cli_variation_and_quantity_and_errors(tmp_path, capsys):
    from fed_ros.commands.partition import main

    _write_demos(tmp_path)
    assert main([str(tmp_path), "--robots", "3", "--by", "task+variation", "--include-failed"]) == 0
    assert "lift/dim_light" in capsys.readouterr().out
    assert main([str(tmp_path), "--robots", "2", "--by", "quantity", "--beta", "1.0"]) == 0
    assert main([str(tmp_path / "missing"), "--robots", "2"]) == 2
    assert "does not exist" in capsys.readouterr().out
    assert main([str(tmp_path), "--by", "embedding"]) == 2
    assert "--checkpoint" in capsys.readouterr().out


def test_partition_cli_embedding_split(tmp_path, capsys):
    import json
    from fed_ros.learning.configuration_policy import PolicyConfig
    from fed_ros.commands.partition import main
    from fed_ros.learning.trainer import initial_state_dict
    from fed_ros.learning.weights import save_checkpoint

    _write_demos(tmp_path / "demos")
    cfg = PolicyConfig(
        kind="lowdim",
        embed_dim=16,
        window=2,
        transformer_layers=1,
        transformer_heads=2,
        transformer_ff=32,
        text_dim=32,
        dropout=0.0,
    )
    save_checkpoint(tmp_path / "p.safetensors", initial_state_dict(cfg, seed=0), cfg)
    rc = main(
        [
            str(tmp_path / "demos"),
            "--robots",
            "2",
            "--by",
            "embedding",
            "--k",
            "2",
            "--alpha",
            "0.1",
            "--checkpoint",
            str(tmp_path / "p.safetensors"),
            "--out",
            str(tmp_path / "parts"),
        ]
    )
    assert rc == 0
    out = capsys.readouterr().out
    assert "| robot | 0 | 1 | total |" in out
    summary = json.loads((tmp_path / "parts" / "partition.json").read_text())
    assert summary["kind"] == "embedding" and sum(map(sum, summary["counts"])) == 10
    # Even an untrained policy's penultimate layer separates the two far-apart state clouds.
    assert summary["ari_clusters_vs_task"] == pytest.approx(1.0)
