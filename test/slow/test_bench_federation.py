"""`fed-ros bench federation`: helpers, and one tiny end-to-end cell in real MuJoCo."""

from __future__ import annotations

import json

import numpy as np
import pytest

from fed_ros.bench.federation import command as F
from fed_ros.bench.federation import experiments as E
from fed_ros.bench.federation import cells as FC
from fed_ros.bench.federation import demos as FD
from fed_ros.bench.federation import evaluation as FE
from fed_ros.bench.federation import run as FR
from fed_ros.bench.federation.methods import fedepth_method, method_by_name
from fed_ros.bench.federation.settings import (
    OVERLAP_CELL_OFFSET,
    PROFILES,
    Family,
    Setting,
    cross_family,
    overlap_methods,
    overlap_setting,
    overlap_shift_setting,
    same_family,
    with_overrides,
)
from fed_ros.core.data.episode import ACTION_DIM, Episode


def _episode(n: int = 6) -> Episode:
    rng = np.random.default_rng(0)
    return Episode(
        task="lift",
        instruction="lift the red cube",
        observations={"eef_pos": rng.normal(size=(n, 3)).astype(np.float32)},
        actions=rng.uniform(-1, 1, size=(n, ACTION_DIM)),
    )


def test_mirror_episode_negates_xy_only():
    ep = _episode()
    m = FD.mirror_episode(ep)
    assert np.allclose(m.actions[:, :2], -ep.actions[:, :2])
    assert np.allclose(m.actions[:, 2:], ep.actions[:, 2:])
    assert m.observations["eef_pos"] is ep.observations["eef_pos"]
    assert m.metadata["mirrored"] == "1"


def test_mirrored_policy_negates_commands():
    class Const:
        def reset(self):
            self.reset_called = True

        def act(self, obs):
            return np.array([0.5, -0.25, 0.1, 1.0], dtype=np.float32)

    p = FE.MirroredPolicy(Const())
    p.reset()
    assert p.act({}).tolist() == [-0.5, 0.25, pytest.approx(0.1), 1.0]


def test_offset_cell_shifts_absolute_positions_only():
    rng = np.random.default_rng(0)
    obs = {
        "eef_pos": rng.normal(size=(4, 3)).astype(np.float32),
        "object_state": rng.normal(size=(4, 32)).astype(np.float32),
        "joint_pos": rng.normal(size=(4, 7)).astype(np.float32),
    }
    ep = Episode(
        task="lift",
        instruction="lift the red cube",
        observations=obs,
        actions=rng.uniform(-1, 1, size=(4, ACTION_DIM)),
    )
    off = (0.0, 0.06, -0.01)
    moved = FD.offset_episode(ep, off)
    assert np.allclose(moved.observations["eef_pos"], obs["eef_pos"] + np.float32(off))
    assert np.allclose(
        moved.observations["object_state"][:, :3], obs["object_state"][:, :3] + np.float32(off)
    )
    # quaternion, eef->object vector, joints and actions (deltas) do not move with the cell
    assert np.array_equal(moved.observations["object_state"][:, 3:], obs["object_state"][:, 3:])
    assert moved.observations["joint_pos"] is obs["joint_pos"] and moved.actions is ep.actions
    assert np.array_equal(ep.observations["eef_pos"], obs["eef_pos"])  # the pool demo is untouched
    fam = Family("b", "lift", "default", True, off)
    both = FD.family_episode(ep, fam)
    assert np.allclose(both.actions[:, :2], -ep.actions[:, :2])
    assert np.allclose(both.observations["eef_pos"], moved.observations["eef_pos"])
    with pytest.raises(ValueError, match="task"):
        FD.offset_observations(obs, "wipe", off)
    with pytest.raises(ValueError, match="cell_offset"):
        Family("bad", cell_offset=(0.0, 5.0, 0.0))

    class Echo:
        def reset(self):
            pass

        def act(self, o):
            return np.asarray(o["eef_pos"], dtype=np.float32)

    frame = {k: v[0] for k, v in obs.items()}
    assert np.allclose(
        FE.OffsetCellPolicy(Echo(), "lift", off).act(frame), frame["eef_pos"] + np.float32(off)
    )


def test_overlap_setting_has_input_skewed_domains_and_two_unequal_bridges():
    prof = PROFILES["quick"]
    ov = overlap_setting(prof)
    a, b = ov.families
    assert b.mirrored and any(b.cell_offset) and not a.mirrored and not any(a.cell_offset)
    mixes = [dict(m) for m in ov.robots]
    bridges = [m for m in mixes if len(m) == 2]
    assert len(bridges) == 2 and all(sum(m.values()) == prof.demos_per_robot for m in mixes)
    # one bridge leans to each domain (equal mixtures would merge everything, see fedepth)
    assert bridges[0][a.name] > bridges[0][b.name] and bridges[1][b.name] > bridges[1][a.name]


def test_overlap_shift_is_the_same_fleet_with_unmirrored_offset_domain_b():
    prof = PROFILES["quick"]
    ov, sh = overlap_setting(prof), overlap_shift_setting(prof)
    assert sh.name == "overlap_shift" and ov.name == "overlap"
    a, b = sh.families
    # pure covariate shift: B sits in the offset work cell but commands like A
    assert not a.mirrored and not any(a.cell_offset)
    assert not b.mirrored and b.cell_offset == OVERLAP_CELL_OFFSET == ov.families[1].cell_offset
    rename = {ov.families[0].name: a.name, ov.families[1].name: b.name}
    assert sh.robots == tuple(tuple((rename[f], c) for f, c in mix) for mix in ov.robots)
    assert sh.num_clusters == ov.num_clusters == 2


def test_overlap_methods_per_variant_and_cell_wiring():
    quick, default = PROFILES["quick"], PROFILES["default"]
    names = lambda prof, st: [m.name for m in overlap_methods(prof, st)]  # noqa: E731
    # quick: the shift variant runs hard, the smallest reachable soft target and the baselines
    assert names(quick, overlap_shift_setting(quick)) == [
        "fedepth_ov000",
        "fedepth_ov040",
        "fedavg",
        "local",
    ]
    sweep = [fedepth_method(o).name for o in quick.overlaps] + ["fedavg", "local"]
    assert names(quick, overlap_setting(quick)) == sweep
    # default keeps the quick list (to fit its hour); gpu runs the full sweep on both variants
    assert names(default, overlap_shift_setting(default)) == names(
        quick, overlap_shift_setting(quick)
    )
    gpu = PROFILES["gpu"]
    assert names(gpu, overlap_shift_setting(gpu)) == names(gpu, overlap_setting(gpu))
    assert (
        method_by_name("fedepth_ov040") == fedepth_method(0.4)
        and method_by_name("local").name == "local"
    )
    for bad in ("fedepth_ov140", "fedepth_ov4", "nope"):
        with pytest.raises(ValueError, match=bad):
            method_by_name(bad)
    keys = [s.key for s in FC.cell_specs(with_overrides(quick, seeds=(0, 1)), ["overlap"])]
    assert len(keys) == 2 * (len(sweep) + 4) and len(set(keys)) == len(keys)
    assert "overlap__fedepth_ov060__s1" in keys and "overlap_shift__fedepth_ov040__s1" in keys
    assert "overlap_shift__fedepth_ov060__s0" not in keys
    with pytest.raises(ValueError, match="fedepth_ov7"):
        FC.cell_specs(with_overrides(quick, overlap_shift_methods=("fedepth_ov7",)), ["overlap"])


def test_overlap_claims_per_variant_and_seed(tmp_path):
    def cell(setting, method, seed, mean, overlap):
        return {
            "setting": setting,
            "method": method,
            "seed": seed,
            "groups": ["a", "b"],
            "cpu_s": 1.0,
            "final": {"mean": mean, "per_family": {"a": mean, "b": mean}},
            "evals": [],
            "rounds": [
                {"round": 0, "diagnostics": {"overlap": overlap, "clusters": {"0": ["robot_0"]}}}
            ],
        }

    prof = with_overrides(PROFILES["quick"], seeds=(0, 1))
    cells = [
        cell(st, "fedepth_ov000", s, h, 0.0)
        for st, h in (("overlap", 0.5), ("overlap_shift", 0.2))
        for s in (0, 1)
    ]
    cells += [
        cell(st, "fedepth_ov040", s, v, 0.4)
        for st, v in (("overlap", 0.25), ("overlap_shift", 0.3))
        for s in (0, 1)
    ]
    lines = E.claims(cells, {}, prof)
    conf = [ln for ln in lines if ln.startswith("- overlap (B mirrored")]
    shift = [ln for ln in lines if ln.startswith("- overlap_shift (B not mirrored")]
    assert (
        len(conf) == 1
        and "25.0% vs hard 50.0%: soft < hard" in conf[0]
        and "soft >= hard on 0 of 2" in conf[0]
    )
    assert len(shift) == 1 and "30.0% vs hard 20.0%: soft > hard" in shift[0]
    assert "s0: 30.0 vs 20.0, s1: 30.0 vs 20.0" in shift[0] and "soft >= hard on 2 of 2" in shift[0]
    md = F.write_report(prof, tmp_path, cells, {}, wall_s=1.0).read_text()
    assert "## overlap_shift: success rate" in md and "sensitivity: overlap_shift" in md
    assert (tmp_path / "fedepth_overlap_shift_sweep.png").is_file()


def test_intra_inter_and_coassignment():
    sim = np.array([[1.0, 0.9, 0.1], [0.9, 1.0, 0.2], [0.1, 0.2, 1.0]])
    intra, inter = FR.intra_inter(sim, ["a", "a", "b"])
    assert intra == pytest.approx(0.9) and inter == pytest.approx(0.15)
    assign = {"r0": [[0, 1.0]], "r1": [[0, 0.5], [1, 0.5]], "r2": [[1, 1.0]]}
    co = FR.coassignment(assign, ["r0", "r1", "r2"])
    assert co.tolist() == [[1, 1, 0], [1, 1, 1], [0, 1, 1]]
    assert FR.hard_clusters(assign, ["r0", "r2", "missing"]) == [0, 1, -1]


def test_settings_shapes_and_validation():
    prof = PROFILES["quick"]
    cross = cross_family(prof)
    assert len(cross.robots) == prof.robots and cross.num_clusters == 2
    assert [cross.dominant_family(n) for n in range(4)] == [
        "lift",
        "lift",
        "lift_mirrored",
        "lift_mirrored",
    ]
    same = same_family(prof, seed=3)
    assert all(sum(c for _, c in mix) == prof.demos_per_robot for mix in same.robots)
    assert same_family(prof, seed=3) == same  # reproducible by seed
    assert len(overlap_setting(prof).robots) == 5
    with pytest.raises(ValueError, match="unknown family"):
        Setting("bad", (Family("a"),), ((("b", 1),),), num_clusters=1)


def test_cli_rejects_bad_arguments(capsys):
    assert F.main(["--quick", "--robots", "1", "--out", "/tmp/never"]) == 2
    assert "robots" in capsys.readouterr().err
    assert F.main(["--quick", "--methods", "nope", "--out", "/tmp/never"]) == 2
    assert F.main(["--quick", "--overlaps", "0.2", "1.5", "--out", "/tmp/never"]) == 2
    assert "1.5" in capsys.readouterr().err


def test_overlap_claim_uses_a_really_overlapping_target(tmp_path):
    """20% unreachable (calibrated 0%) -> 'NOT tested'; the 40% cell that overlaps is compared
    instead."""

    def cell(method, mean, overlap, clusters):
        diag = {"overlap": overlap, "clusters": clusters}
        return {
            "setting": "overlap",
            "method": method,
            "seed": 0,
            "groups": ["a", "b"],
            "cpu_s": 1.0,
            "final": {"mean": mean, "per_family": {"a": mean, "b": mean}},
            "evals": [],
            "rounds": [{"round": 0, "diagnostics": diag}],
        }

    prof = with_overrides(PROFILES["quick"], overlaps=(0.0, 0.2, 0.4, 1.0))
    cells = [
        cell("fedepth_ov000", 0.10, 0.0, {"0": ["robot_0"], "1": ["robot_1"]}),
        cell("fedepth_ov020", 0.10, 0.0, {"0": ["robot_0"], "1": ["robot_1"]}),
        cell(
            "fedepth_ov040", 0.25, 0.4, {"0": ["robot_0", "robot_1"], "1": ["robot_1", "robot_0"]}
        ),
        cell("fedepth_ov100", 0.05, 1.0, {"0": ["robot_0", "robot_1"]}),
    ]
    lines = "\n".join(E.claims(cells, {}, prof))
    assert "NOT tested" in lines
    assert "target 40% (calibrated overlap 40%): 25.0% vs hard 10.0%: soft > hard" in lines
    md = F.write_report(prof, tmp_path, cells, {}, wall_s=1.0).read_text()
    assert "| 20% | 0% | {0} {1} | 10.0 |" in md and "| 40% | 40% | {0,1} {1,0} | 25.0 |" in md


def test_report_claims_from_records():
    def cell(method, mean, coassign):
        return {
            "setting": "cross_family",
            "method": method,
            "seed": 0,
            "groups": ["a", "a", "b"],
            "final": {"mean": mean, "per_family": {"a": mean, "b": mean}},
            "evals": [],
            "rounds": [{"round": 0, "coassign": coassign}],
        }

    full = [[1, 1, 0], [1, 1, 0], [0, 0, 1]]
    ones = [[1, 1, 1]] * 3
    cells = [
        cell("fedavg", 0.3, ones),
        cell("feddrman", 0.8, full),
        cell("feddrman_no_cua", 0.35, ones),
    ]
    lines = "\n".join(E.claims(cells, {}, None))
    assert "+50.0 pp" in lines and "REPRODUCED" in lines
    assert "collapses towards FedAvg" in lines
    assert "same-family pairs 100%" in lines and "cross-family 0%" in lines


@pytest.mark.sim
def test_tiny_end_to_end_cell_is_resumable(tmp_path, monkeypatch):
    out = tmp_path / "bench"
    argv = [
        "--quick",
        "--only",
        "cross",
        "--methods",
        "fedavg",
        "--robots",
        "2",
        "--demos",
        "2",
        "--rounds",
        "1",
        "--local-steps",
        "3",
        "--eval-episodes",
        "1",
        "--out",
        str(out),
    ]
    assert F.main(argv) == 0
    cell = json.loads((out / "cells" / "cross_family__fedavg__s0.json").read_text())
    assert cell["method"] == "fedavg" and len(cell["rounds"]) == 1
    row = cell["rounds"][0]
    # FedAvg keeps every robot in one cluster, and both families were rolled out.
    assert row["coassign"] == [[1.0, 1.0], [1.0, 1.0]]
    assert set(cell["final"]["per_family"]) == {"lift", "lift_mirrored"}
    assert 0.0 <= cell["final"]["mean"] <= 1.0
    # Every rollout is recorded, and none outlasts its family's evaluation horizon.
    horizons = cell["eval_max_steps"]
    assert set(horizons) == {"lift", "lift_mirrored"} and cell["rollouts"]
    assert all(0 < steps <= horizons[fam] for fam, _, steps in cell["rollouts"])
    assert len(list((out / "demos").rglob("*.npz"))) >= 4  # cached scripted demos
    report = (out / "report.md").read_text()
    assert "| fedavg |" in report and (out / "cross_family_success_vs_round.png").is_file()

    # Rerun: the finished cell is loaded, not recomputed.
    def boom(*a, **k):
        raise AssertionError("finished cell was recomputed")

    monkeypatch.setattr(FC, "run_cell", boom)
    assert F.main(argv) == 0


@pytest.mark.sim
def test_a_compressed_cell_counts_its_bytes_and_is_its_own_cell(tmp_path):
    """--encoding int8_block: the cell file is separate from the float32 one, every round
    records the bytes of its models and updates (about 3.9x fewer than float32)."""
    from fed_ros.core.encodings import encoded_nbytes
    from fed_ros.learning.trainer import initial_state_dict

    out = tmp_path / "bench"
    argv = ["--quick", "--only", "cross", "--methods", "fedavg", "--robots", "2", "--demos", "2"]
    argv += ["--rounds", "1", "--local-steps", "2", "--eval-episodes", "1", "--out", str(out)]
    assert F.main([*argv, "--encoding", "int8_block"]) == 0
    cell = json.loads((out / "cells" / "cross_family__fedavg__s0__int8_block.json").read_text())
    assert cell["profile"]["encoding"] == "int8_block"
    model = initial_state_dict(PROFILES["quick"].policy_config(), seed=0)
    row = cell["rounds"][0]
    assert row["update_bytes"] == 2 * encoded_nbytes(model, "int8_block")
    assert row["model_bytes"] == encoded_nbytes(model, "int8_block")
    assert 4 * sum(v.size for v in model.values()) / encoded_nbytes(model, "int8_block") > 3.8
    assert not (out / "cells" / "cross_family__fedavg__s0.json").exists()
    with pytest.raises(ValueError, match="unknown encoding 'int4'"):
        with_overrides(PROFILES["quick"], encoding="int4")
    with pytest.raises(ValueError, match="unknown model encoding 'topk'"):
        with_overrides(PROFILES["quick"], encoding="int4_block/topk")


def test_a_benchmark_encoding_names_updates_and_models_apart():
    from fed_ros.bench.federation.wire import encoding_suffix, split_encoding

    assert split_encoding("int8_block") == ("int8_block", "int8_block")
    assert split_encoding("topk:0.05") == ("topk:0.05", "float32")  # models never sparse
    assert split_encoding("int4_delta") == ("int4_delta", "float32")  # nor deltas
    assert split_encoding("int4_block/float32") == ("int4_block", "float32")
    assert encoding_suffix("int4_block/float32") == "int4_block+float32"
    assert with_overrides(PROFILES["quick"], encoding="int4_block/float32").model_encoding == (
        "float32"
    )


@pytest.mark.sim
def test_a_topk_cell_sends_sparse_deltas_and_keeps_each_robots_residual(tmp_path):
    """--encoding topk:0.05: updates are 5 % of each large tensor's changes in every round,
    models float32, and the cell file is its own."""
    from fed_ros.core.encodings import topk
    from fed_ros.core.encodings import encoded_nbytes
    from fed_ros.learning.trainer import initial_state_dict

    out = tmp_path / "bench"
    argv = ["--quick", "--only", "cross", "--methods", "fedavg", "--robots", "2", "--demos", "2"]
    argv += ["--rounds", "2", "--local-steps", "2", "--eval-episodes", "1", "--out", str(out)]
    assert F.main([*argv, "--encoding", "topk:0.05"]) == 0
    cell = json.loads((out / "cells" / "cross_family__fedavg__s0__topk-0.05.json").read_text())
    assert cell["profile"]["encoding"] == "topk:0.05"
    model = initial_state_dict(PROFILES["quick"].policy_config(), seed=0)
    sizes = [v.size for v in model.values()]
    for row in cell["rounds"]:
        assert row["update_bytes"] == 2 * topk.payload_nbytes(sizes, 0.05)
        assert row["model_bytes"] == encoded_nbytes(model, "float32")
    # The cell is a TensorBoard run too (auto: installed here), with its bytes and success.
    from support.tb_events import read_scalars

    tb = read_scalars(out / "tb" / "cross_family__fedavg__s0__topk-0.05")
    sent = 2.0 * topk.payload_nbytes(sizes, 0.05)
    assert tb["bytes/updates"] == [(0, sent), (1, sent)]
    assert [step for step, _ in tb["eval/success_mean"]] == [e["round"] for e in cell["evals"]]
    # (9 % of this tiny model's values are in tensors sent whole: 5.4x, 8.5x on a fleet's policy)
    assert encoded_nbytes(model, "float32") / topk.payload_nbytes(sizes, 0.05) > 5.0
    with pytest.raises(ValueError, match="top-k fraction"):
        with_overrides(PROFILES["quick"], encoding="topk:2")


@pytest.mark.sim
def test_a_quantized_delta_cell_sends_deflated_deltas_below_the_blockwise_size(tmp_path):
    """--encoding int8_delta: each round's updates are the robots' deltas, int8 and deflated
    (fewer bytes than int8_block of the same model), with float32 models."""
    from fed_ros.core.encodings import encoded_nbytes
    from fed_ros.learning.trainer import initial_state_dict

    out = tmp_path / "bench"
    argv = ["--quick", "--only", "cross", "--methods", "fedavg", "--robots", "2", "--demos", "2"]
    argv += ["--rounds", "2", "--local-steps", "2", "--eval-episodes", "1", "--out", str(out)]
    assert F.main([*argv, "--encoding", "int8_delta"]) == 0
    cell = json.loads((out / "cells" / "cross_family__fedavg__s0__int8_delta.json").read_text())
    model = initial_state_dict(PROFILES["quick"].policy_config(), seed=0)
    for row in cell["rounds"]:
        assert 0 < row["update_bytes"] < 2 * encoded_nbytes(model, "int8_block"), row
        assert row["model_bytes"] == encoded_nbytes(model, "float32")
    assert with_overrides(PROFILES["quick"], encoding="int4_delta").model_encoding == "float32"


def test_eval_horizons_scale_the_longest_demo_per_family():
    fams = (Family("lift"), Family("lift_mirrored", mirrored=True), Family("stack", "stack"))
    setting = Setting("s", fams, ((("lift", 1),), (("lift_mirrored", 1),)), num_clusters=2)
    data = {"robot_0": [_episode(40), _episode(52)], "robot_1": [_episode(50)]}
    # Mirroring changes actions only, so both lift families share the lift demos' lengths;
    # a family without demos keeps its task horizon (absent from the map).
    assert FR.eval_horizons(setting, data, 2.5) == {"lift": 130, "lift_mirrored": 130}
    assert FR.eval_horizons(setting, data, None) == {}
    with pytest.raises(ValueError, match="eval_horizon_factor"):
        FR.eval_horizons(setting, data, 0.5)


def test_image_cells_are_named_only_and_use_the_camera_fleet():
    from fed_ros.bench.federation.image import IMAGE_SETTING, image_profile

    assert "image" not in E.DEFAULT_EXPERIMENTS  # ~30 min: never part of the default run
    prof = image_profile()
    specs = FC.cell_specs(PROFILES["quick"], ["cross", "image"])
    image = [s for s in specs if s.setting.name == IMAGE_SETTING]
    assert [s.method.name for s in image] == ["feddrman", "fedavg", "local"]
    assert all(s.setting.cameras and s.profile.policy_config().kind == "image" for s in image)
    # The same fleet as the low-dim cross_family cells, only seen through the cameras.
    low = cross_family(prof)
    assert image[0].setting.robots == low.robots and image[0].setting.families == low.families
    assert not any(s.setting.cameras for s in specs if s not in image)
    assert (
        image_profile(F._parser().parse_args(["--robots", "2", "--methods", "fedavg"])).robots == 2
    )
    assert all(
        s.setting.name != IMAGE_SETTING for s in FC.cell_specs(PROFILES["quick"], ["cross"], prof)
    )


@pytest.mark.sim
def test_tiny_image_cells_learn_from_camera_demos_and_report_beside_lowdim(tmp_path):
    out = tmp_path / "bench"
    argv = [
        "--only",
        "image",
        "--robots",
        "2",
        "--demos",
        "2",
        "--rounds",
        "1",
        "--local-steps",
        "2",
        "--eval-episodes",
        "1",
        "--jobs",
        "1",
        "--out",
        str(out),
    ]
    assert F.main(argv) == 0
    for method in ("feddrman", "fedavg", "local"):
        cell = json.loads((out / "cells" / f"cross_family_image__{method}__s0.json").read_text())
        assert cell["profile"]["policy"]["kind"] == "image" and len(cell["rounds"]) == 1, method
        assert set(cell["final"]["per_family"]) == {"lift", "lift_mirrored"}, method
        assert cell["rollouts"] and 0.0 <= cell["final"]["mean"] <= 1.0
    # Camera demonstrations were collected once and cached apart from the low-dim pool.
    from fed_ros.core.data.episode import Episode

    files = sorted((out / "demos").glob("*__cam84/*.npz"))
    assert len(files) >= 4 and not list((out / "demos").glob("*noise0.05__seed1000/*.npz"))
    demo = Episode.load(files[0])
    assert demo.observations["agentview_image"].shape[1:] == (84, 84, 3)
    report = (out / "report.md").read_text()
    assert "## cross_family_image: success rate (%) per family from cameras" in report
    assert all(f"| {m} |" in report for m in ("feddrman", "fedavg", "local"))
    assert "Cross-family from cameras (image policy): feddrman" in report


@pytest.mark.sim
def test_the_few_demos_fleet_runs_its_three_families_and_checks_the_targets(tmp_path):
    """--only few: K = 3 x robots-per-family, each with its few demos, three families, its own
    rollouts per (model, family); the report states the issue's targets (here: tiny sizes)."""
    out = tmp_path / "few"
    argv = ["--quick", "--only", "few", "--methods", "local", "feddrman", "--rounds", "1"]
    argv += ["--few-robots-per-family", "1", "--few-demos", "2", "--local-steps", "2"]
    argv += ["--eval-episodes", "1", "--seeds", "0", "--jobs", "1", "--out", str(out)]
    assert F.main(argv) == 0
    cell = json.loads((out / "cells" / "few_demos__feddrman__s0.json").read_text())
    assert cell["robots"] == ["robot_0", "robot_1", "robot_2"]
    assert cell["groups"] == ["lift", "lift_mirrored", "lift_cell"]
    assert all(count == 2 for mix in cell["robot_mix"].values() for count in mix.values())
    assert set(cell["final"]["per_family"]) == {"lift", "lift_mirrored", "lift_cell"}
    assert cell["profile"]["eval_episodes"] == 1
    report = (out / "report.md").read_text()
    assert "## few_demos" in report and "target >= +15 pp" in report
    assert "few" not in E.DEFAULT_EXPERIMENTS  # 9 robots x 20 rollouts: only when asked


@pytest.mark.sim
def test_the_few_demos_fleet_can_take_pick_place_can_arms_as_its_third_family(tmp_path):
    """--few-third-family can (issue 23 item 2: a can family in the benchmark again): the third
    family is PickPlaceCan arms, its own setting, table and claims beside few_demos'."""
    out = tmp_path / "few_can"
    argv = [
        "--quick",
        "--only",
        "few",
        "--few-third-family",
        "can",
        "--methods",
        "local",
        "feddrman",
    ]
    argv += ["--few-robots-per-family", "1", "--few-demos", "1", "--local-steps", "2"]
    argv += ["--rounds", "1", "--eval-episodes", "1", "--seeds", "0", "--jobs", "1"]
    assert F.main(argv + ["--out", str(out)]) == 0
    cell = json.loads((out / "cells" / "few_demos_can__feddrman__s0.json").read_text())
    assert cell["groups"] == ["lift", "lift_mirrored", "can"]
    assert set(cell["final"]["per_family"]) == {"lift", "lift_mirrored", "can"}
    assert cell["profile"]["few_third_family"] == "can"
    assert not (out / "cells" / "few_demos__feddrman__s0.json").exists()
    report = (out / "report.md").read_text()
    assert "## few_demos_can" in report and "Few demos per arm (few_demos_can)" in report


@pytest.mark.sim
def test_the_few_demos_fleet_from_cameras_is_its_own_setting(tmp_path):
    """--only few_image (issue 23 item 3: "low-dim and image"): the few-demos fleet's robots,
    demos and rollouts on the image policy and camera demonstrations, its own cells, table and
    claims; never part of the default run."""
    out = tmp_path / "few_image"
    argv = ["--only", "few_image", "--methods", "local", "feddrman", "--rounds", "1"]
    argv += ["--few-robots-per-family", "1", "--few-demos", "1", "--local-steps", "2"]
    argv += ["--eval-episodes", "1", "--seeds", "0", "--jobs", "1", "--out", str(out)]
    assert F.main(argv) == 0
    cell = json.loads((out / "cells" / "few_demos_image__feddrman__s0.json").read_text())
    assert cell["profile"]["policy"]["kind"] == "image"
    assert cell["groups"] == ["lift", "lift_mirrored", "lift_cell"]
    assert all(count == 1 for mix in cell["robot_mix"].values() for count in mix.values())
    assert set(cell["final"]["per_family"]) == {"lift", "lift_mirrored", "lift_cell"}
    assert cell["profile"]["eval_episodes"] == 1 and cell["rollouts"]
    assert (out / "cells" / "few_demos_image__local__s0.json").exists()
    assert not (out / "cells" / "few_demos__feddrman__s0.json").exists()
    assert sorted((out / "demos").glob("*__cam84/*.npz"))  # camera demonstrations
    report = (out / "report.md").read_text()
    assert "## few_demos_image" in report and "Few demos per arm (few_demos_image)" in report
    assert "few_image" not in E.DEFAULT_EXPERIMENTS  # hours on 2 cores: only when asked


def test_an_unknown_third_family_is_refused_naming_it():
    from dataclasses import replace

    from fed_ros.bench.federation.few import few_demos_setting
    from fed_ros.bench.federation.settings import PROFILES

    quick = PROFILES["quick"]
    # C for CUA/IFCA: the can arms are a third action mapping, the offset cell shares Lift's.
    assert few_demos_setting(replace(quick, few_third_family="can")).num_clusters == 3
    assert few_demos_setting(quick).num_clusters == 2
    with pytest.raises(ValueError, match="few_third_family must be one of .*got 'stack'"):
        few_demos_setting(replace(PROFILES["quick"], few_third_family="stack"))
    with pytest.raises(SystemExit):
        F.main(["--only", "few", "--few-third-family", "stack"])


def test_experiments_are_declared_once_and_the_command_tests_for_none():
    """A setting is one registry entry: the command and the cell grid iterate the registry and
    never test for an experiment's name (the old if-chains)."""
    import re
    from pathlib import Path

    names = "|".join(E.EXPERIMENTS)
    for module in (F, FC):
        src = Path(module.__file__).read_text()
        assert not re.search(rf"\"({names})\" (not )?in ", src), module.__name__
    only = next(a for a in F._parser()._actions if a.dest == "only")
    assert tuple(only.choices) == tuple(E.EXPERIMENTS)
    assert set(E.DEFAULT_EXPERIMENTS) == {"cross", "same", "overlap", "rnd", "partition"}
    # Each grid experiment adds its own cells, and a cell belongs to one experiment.
    quick = PROFILES["quick"]
    keys = {
        n: {s.key for s in FC.cell_specs(quick, [n])} for n in ("cross", "same", "overlap", "few")
    }
    assert all(keys.values())
    assert sum(map(len, keys.values())) == len(set().union(*keys.values()))
    assert {s.key for s in FC.cell_specs(quick, list(keys))} == set().union(*keys.values())
