"""`make interop`: fed_ros's LeRobot datasets against lerobot 0.4.4 itself, both directions.

Runs in lerobot's own venv (build/lerobot-venv, requirements-interop.txt); fed_ros's side runs in
.venv through tools/lerobot_interop_fed_ros.py and the `fed-ros` command. Steps:

1. fed_ros records 3 scripted-expert Lift demonstrations (MuJoCo, 2 cameras) and exports them
   twice: cameras as PNG and as mp4.
2. On each export, lerobot: loads it (every state, action and pixel equals the recording),
   iterates a DataLoader, normalises a batch with ACT's pre-processor (state, action and cameras
   come out as (x - mean) / std of meta/stats.json, not passed through), merges two copies
   (`aggregate_datasets`), deletes an episode (`delete_episodes`) and appends one.
3. lerobot writes the same frames itself (`LeRobotDataset.create` / `add_frame` /
   `save_episode`, PNG and its default AV1 video); its files, columns and types must equal the
   export's, and its statistics the export's.
4. `fed-ros dataset import` reads both lerobot-written datasets: states and actions exact, the
   task strings kept, pixels exact (PNG) or within AV1's loss (video); then one training step of
   fed_ros's image policy on them.

Prints PASS/FAIL per check and exits 1 when any fails.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import subprocess
import sys
import time
import traceback
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import torch

from lerobot.datasets.aggregate import aggregate_datasets
from lerobot.datasets.dataset_tools import delete_episodes
from lerobot.datasets.lerobot_dataset import LeRobotDataset
from lerobot.datasets.utils import dataset_to_policy_features
from lerobot.policies.act.configuration_act import ACTConfig
from lerobot.policies.factory import make_pre_post_processors

# torchcodec needs FFmpeg's shared libraries, which this machine lacks; lerobot's pyav backend
# decodes the same files (decode_video_frames, backend "pyav").
VIDEO_BACKEND = "pyav"
STATE_KEYS = ("joint_pos", "gripper_qpos", "eef_pos", "eef_quat")
CAMERAS = {
    "observation.images.agentview": "agentview_image",
    "observation.images.wrist": "wrist_image",
}
DEFAULTS = ("timestamp", "frame_index", "episode_index", "index", "task_index")
RESULTS: list[tuple[str, bool, str]] = []


def check(name: str):
    """Run the decorated check now; record PASS with its detail or FAIL with the error."""

    def run(fn):
        t0 = time.perf_counter()
        try:
            detail = fn() or ""
            ok = True
        except Exception as err:  # a check's failure is reported, the others still run
            detail = f"{type(err).__name__}: {err}"
            traceback.print_exc(limit=3)
            ok = False
        RESULTS.append((name, ok, detail))
        print(
            f"{'PASS' if ok else 'FAIL'} {name} ({time.perf_counter() - t0:.1f} s) {detail}",
            flush=True,
        )
        return fn

    return run


def load_source(demos: Path) -> list[dict[str, np.ndarray]]:
    """The recorded episodes (fed_ros's .npz: obs/<key>, actions, meta_json), read with numpy."""
    out = []
    for path in sorted(demos.glob("*.npz")):
        with np.load(path, allow_pickle=False) as data:
            episode = {k: data[k] for k in data.files}
        episode["state"] = np.concatenate([episode[f"obs/{k}"] for k in STATE_KEYS], 1)
        episode["instruction"] = json.loads(bytes(episode["meta_json"]).decode())["instruction"]
        out.append(episode)
    return out


def frames_of(source: list[dict]) -> list[tuple[int, int, dict]]:
    """(episode, frame, episode dict) for every recorded frame, in dataset order."""
    return [(e, i, ep) for e, ep in enumerate(source) for i in range(len(ep["actions"]))]


def assert_equals_source(ds: LeRobotDataset, source: list[dict]) -> str:
    """Every frame of ``ds`` equals the recording: state, action, object state and pixels."""
    frames = frames_of(source)
    if (ds.num_frames, ds.num_episodes) != (len(frames), len(source)):
        raise AssertionError(
            f"{ds.num_episodes} episodes/{ds.num_frames} frames, want {len(frames)}"
        )
    worst = 0
    for index, (e, i, ep) in enumerate(frames):
        item = ds[index]
        if (int(item["episode_index"]), int(item["frame_index"])) != (e, i):
            raise AssertionError(
                f"row {index} is episode {item['episode_index']} frame {item['frame_index']}"
            )
        np.testing.assert_array_equal(item["observation.state"].numpy(), ep["state"][i])
        np.testing.assert_array_equal(item["action"].numpy(), ep["actions"][i])
        np.testing.assert_array_equal(
            item["observation.environment_state"].numpy(), ep["obs/object_state"][i]
        )
        for feature, key in CAMERAS.items():
            pixels = (item[feature].permute(1, 2, 0).numpy() * 255).round().astype(int)
            worst = max(worst, int(np.abs(pixels - ep[f"obs/{key}"][i]).max()))
        if abs(float(item["timestamp"]) - i / ds.fps) > 1e-6:
            raise AssertionError(f"row {index}: timestamp {float(item['timestamp'])}")
    if worst:
        raise AssertionError(f"pixels differ by up to {worst}")
    return f"{ds.num_episodes} episodes, {ds.num_frames} frames; states, actions, pixels equal"


def act_normalisation(ds: LeRobotDataset) -> str:
    """ACT's pre-processor (what lerobot-train builds) normalises state, action and cameras."""
    features = dataset_to_policy_features(ds.meta.features)
    cfg = ACTConfig(device="cpu", pretrained_backbone_weights=None)
    cfg.output_features = {k: f for k, f in features.items() if k == "action"}
    cfg.input_features = {k: f for k, f in features.items() if k != "action"}
    pre, _ = make_pre_post_processors(cfg, dataset_stats=ds.meta.stats)
    batch = next(iter(torch.utils.data.DataLoader(ds, batch_size=32, shuffle=False)))
    raw = {k: v.clone() for k, v in batch.items() if isinstance(v, torch.Tensor)}
    out = pre(batch)
    lines = []
    for key in ("observation.state", "action", "observation.images.wrist"):
        stats = ds.meta.stats[key]
        mean = torch.as_tensor(np.asarray(stats["mean"]), dtype=torch.float32)
        std = torch.as_tensor(np.asarray(stats["std"]), dtype=torch.float32)
        want = (raw[key] - mean) / (std + 1e-8)
        torch.testing.assert_close(out[key].cpu(), want, rtol=1e-4, atol=1e-4)
        moved = float((out[key].cpu() - raw[key]).abs().max())
        if moved < 0.1:
            raise AssertionError(f"{key} passed through (largest change {moved})")
        lines.append(f"{key} changed by up to {moved:.2f}")
    return "; ".join(lines)


def write_with_lerobot(export: Path, out: Path, use_videos: bool) -> LeRobotDataset:
    """The export's frames written again by lerobot itself (create / add_frame / save_episode)."""
    src = LeRobotDataset("local/src", root=export, video_backend=VIDEO_BACKEND)
    features = {k: dict(v) for k, v in src.meta.features.items() if k not in DEFAULTS}
    for key in CAMERAS:
        features[key] = {k: v for k, v in features[key].items() if k != "info"}
        features[key]["dtype"] = "video" if use_videos else "image"
    ds = LeRobotDataset.create(
        "local/lerobot_written",
        fps=src.fps,
        features=features,
        root=out,
        robot_type=src.meta.robot_type,
        use_videos=use_videos,
    )
    episode = 0
    for index in range(src.num_frames):
        item = src[index]
        if int(item["episode_index"]) != episode:
            ds.save_episode()
            episode = int(item["episode_index"])
        frame = {k: item[k].numpy() for k in features if k not in CAMERAS}
        for key in CAMERAS:
            frame[key] = (item[key].permute(1, 2, 0).numpy() * 255).round().astype(np.uint8)
        frame["task"] = item["task"]
        ds.add_frame(frame)
    ds.save_episode()
    ds.finalize()
    return LeRobotDataset("local/lerobot_written", root=out, video_backend=VIDEO_BACKEND)


def same_layout(ours: Path, theirs: Path) -> str:
    """The export's files, info, columns and types are the ones lerobot wrote for the same data."""
    ours_files = {p.relative_to(ours).as_posix() for p in ours.rglob("*") if p.is_file()}
    their_files = {p.relative_to(theirs).as_posix() for p in theirs.rglob("*") if p.is_file()}
    if ours_files != their_files:
        raise AssertionError(
            f"files: ours only {ours_files - their_files}, lerobot only {their_files - ours_files}"
        )
    a, b = (json.loads((r / "meta/info.json").read_text()) for r in (ours, theirs))
    for key in set(a) | set(b):
        if key != "features" and a.get(key) != b.get(key):
            raise AssertionError(f"info.json {key}: ours {a.get(key)!r}, lerobot {b.get(key)!r}")
    for name in set(a["features"]) | set(b["features"]):
        fa, fb = a["features"].get(name, {}), b["features"].get(name, {})
        fa, fb = ({k: v for k, v in f.items() if k != "info"} for f in (fa, fb))
        if fa != fb:
            raise AssertionError(f"info.json features.{name}: ours {fa}, lerobot {fb}")
    compared = 0
    for rel in sorted(ours_files):
        if not rel.endswith(".parquet"):
            continue
        sa, sb = pq.read_schema(ours / rel), pq.read_schema(theirs / rel)
        fields_a = [
            (f.name, str(f.type).replace("large_", ""))
            for f in sa
            if not f.name.startswith("fed_ros/")
        ]
        fields_b = [(f.name, str(f.type).replace("large_", "")) for f in sb]
        if fields_a != fields_b:
            diff = [x for x in fields_a if x not in fields_b] + [
                x for x in fields_b if x not in fields_a
            ]
            raise AssertionError(f"{rel}: columns differ: {diff[:6]}")
        if b"huggingface" in (sb.metadata or {}):
            ha = json.loads(sa.metadata[b"huggingface"])["info"]["features"]
            hb = json.loads(sb.metadata[b"huggingface"])["info"]["features"]
            if ha != hb:
                raise AssertionError(f"{rel}: huggingface schema metadata differs")
        compared += 1
    return f"{len(ours_files)} files, {compared} parquet schemas equal (fed_ros/* columns aside)"


def same_stats(ours: Path, theirs: Path) -> str:
    """Per-episode and dataset statistics equal lerobot's for the same data (camera std aside)."""
    ea = pq.read_table(ours / "meta/episodes/chunk-000/file-000.parquet").to_pydict()
    eb = pq.read_table(theirs / "meta/episodes/chunk-000/file-000.parquet").to_pydict()
    sa, sb = (json.loads((r / "meta/stats.json").read_text()) for r in (ours, theirs))
    pairs = [(c, ea[c], eb[c]) for c in eb if c.startswith("stats/")]
    pairs += [(f"{f}/{k}", sa[f][k], sb[f][k]) for f in sb for k in sb[f]]
    means = {name: np.asarray(x, float) for name, x, _ in pairs if name.endswith("/mean")}
    worst, skipped = 0.0, 0
    for name, x, y in pairs:
        x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
        if name.endswith("/std"):
            if "images" in name:
                skipped += (
                    1  # lerobot squares uint8 pixels, which wrap (core/data/lerobot_stats.py)
                )
                continue
            # lerobot's variance is E[x^2] - E[x]^2 in float32: its error is a few float32
            # epsilons of E[x^2]; ours is float64. Compare variances within that error.
            second = means[name[: -len("std")] + "mean"] ** 2 + x**2
            err = np.abs(x**2 - y**2)
            if np.any(err > 8 * np.finfo(np.float32).eps * second + 1e-12):
                raise AssertionError(f"{name}: ours {x.ravel()[:4]}, lerobot {y.ravel()[:4]}")
            continue
        # Quantiles are histogram estimates: float32 vs float64 bin edges move them by ~1e-6.
        np.testing.assert_allclose(x, y, rtol=1e-4, atol=1e-5, err_msg=name)
        worst = max(worst, float(np.abs(x - y).max()))
    return (
        f"{len(pairs) - skipped} statistics equal (std within float32 rounding, others within "
        f"{worst:.1e}; {skipped} camera std left out)"
    )


def main(argv: list[str]) -> int:
    """Run every check; 0 when all pass."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--fed-ros-venv", type=Path, default=Path(".venv"))
    parser.add_argument("--work", type=Path, default=Path("build/interop"))
    args = parser.parse_args(argv)
    logging.disable(logging.WARNING)
    torch.set_num_threads(1)
    t_start = time.perf_counter()
    work = args.work.resolve()
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    py, fed_ros = args.fed_ros_venv / "bin/python", args.fed_ros_venv / "bin/fed-ros"
    helper = Path(__file__).with_name("lerobot_interop_fed_ros.py")
    env = {**os.environ, "MUJOCO_GL": "egl", "OMP_NUM_THREADS": "1"}

    def fed(*cmd: object) -> str:
        # lerobot's AV1 encoder (SVT-AV1) sets the thread that opens it to SCHED_FIFO 99 when it
        # may (root): fed_ros's side must not inherit a real-time policy (docs/testing.md).
        done = subprocess.run(
            [str(c) for c in cmd],
            env=env,
            capture_output=True,
            text=True,
            preexec_fn=lambda: os.sched_setscheduler(0, os.SCHED_OTHER, os.sched_param(0)),
        )
        if done.returncode:
            command = " ".join(map(str, cmd[:3]))
            output = done.stderr[-800:] + done.stdout[-800:]
            raise AssertionError(f"{command} ... exit {done.returncode}: {output}")
        return done.stdout.strip().splitlines()[-1] if done.stdout.strip() else ""

    demos = work / "demos"
    exports = {"png": work / "export_png", "mp4": work / "export_mp4"}

    @check("fed_ros records 3 demonstrations and exports them (PNG and mp4 cameras)")
    def _record():
        fed(py, helper, "record", demos)
        for kind, out in exports.items():
            fed(
                fed_ros,
                "dataset",
                "export",
                demos,
                out,
                "--robot-profile",
                "panda_sim",
                "--cameras",
                kind,
            )
        return f"{len(list(demos.glob('*.npz')))} episodes"

    source = load_source(demos) if demos.is_dir() else []
    for kind, root in exports.items():

        @check(f"[{kind}] LeRobotDataset loads the export equal to the recording")
        def _load():
            return assert_equals_source(
                LeRobotDataset("local/ours", root=root, video_backend=VIDEO_BACKEND), source
            )

        @check(f"[{kind}] a DataLoader iterates over every frame")
        def _loader():
            ds = LeRobotDataset("local/ours", root=root, video_backend=VIDEO_BACKEND)
            seen = sum(
                len(b["index"])
                for b in torch.utils.data.DataLoader(ds, batch_size=16, shuffle=True)
            )
            if seen != ds.num_frames:
                raise AssertionError(f"{seen} frames of {ds.num_frames}")
            return f"{seen} frames in batches of 16"

        @check(f"[{kind}] ACT's pre-processor normalises with the export's statistics")
        def _normalise():
            return act_normalisation(
                LeRobotDataset("local/ours", root=root, video_backend=VIDEO_BACKEND)
            )

        @check(f"[{kind}] aggregate_datasets merges two copies of the export")
        def _merge():
            copy = work / f"copy_{kind}"
            shutil.copytree(root, copy)
            merged = work / f"merged_{kind}"
            aggregate_datasets(
                ["local/a", "local/b"], "local/merged", roots=[root, copy], aggr_root=merged
            )
            ds = LeRobotDataset("local/merged", root=merged, video_backend=VIDEO_BACKEND)
            n = len(frames_of(source))
            if (ds.num_episodes, ds.num_frames) != (6, 2 * n):
                raise AssertionError(f"{ds.num_episodes} episodes, {ds.num_frames} frames")
            last = ds[2 * n - 1]
            np.testing.assert_array_equal(last["action"].numpy(), source[-1]["actions"][-1])
            count = ds.meta.stats["action"]["count"].tolist()
            if count != [2 * n]:
                raise AssertionError(f"merged action count {count}")
            return f"6 episodes, {2 * n} frames, stats count {count}"

        @check(f"[{kind}] delete_episodes removes episode 1")
        def _delete():
            ds = LeRobotDataset("local/ours", root=root, video_backend=VIDEO_BACKEND)
            delete_episodes(ds, [1], output_dir=work / f"deleted_{kind}", repo_id="local/deleted")
            # Read back with the pyav decoder (delete_episodes' own return value uses torchcodec).
            out = LeRobotDataset(
                "local/deleted", root=work / f"deleted_{kind}", video_backend=VIDEO_BACKEND
            )
            want = len(source[0]["actions"]) + len(source[2]["actions"])
            if (out.num_episodes, out.num_frames) != (2, want):
                raise AssertionError(f"{out.num_episodes} episodes, {out.num_frames} frames")
            first_of_2 = out[len(source[0]["actions"])]
            np.testing.assert_array_equal(
                first_of_2["observation.state"].numpy(), source[2]["state"][0]
            )
            now = int(first_of_2["episode_index"])
            return f"2 episodes, {want} frames; old episode 2 is episode {now}"

        @check(f"[{kind}] appending an episode (add_frame / save_episode)")
        def _append():
            copy = work / f"appended_{kind}"
            shutil.copytree(root, copy)
            ds = LeRobotDataset("local/appended", root=copy, video_backend=VIDEO_BACKEND)
            ep = source[0]
            for i in range(len(ep["actions"])):
                frame = {
                    "observation.state": ep["state"][i],
                    "observation.environment_state": ep["obs/object_state"][i],
                    "action": ep["actions"][i],
                    "task": "an appended episode",
                }
                frame.update({f: ep[f"obs/{k}"][i] for f, k in CAMERAS.items()})
                ds.add_frame(frame)
            ds.save_episode()
            ds.finalize()
            back = LeRobotDataset("local/appended", root=copy, video_backend=VIDEO_BACKEND)
            n = len(frames_of(source))
            if (back.num_episodes, back.num_frames) != (4, n + len(ep["actions"])):
                raise AssertionError(f"{back.num_episodes} episodes, {back.num_frames} frames")
            item = back[n + 3]
            np.testing.assert_array_equal(item["observation.state"].numpy(), ep["state"][3])
            if item["task"] != "an appended episode":
                raise AssertionError(f"task {item['task']!r}")
            count = back.meta.stats["action"]["count"].tolist()
            return f"4 episodes, {back.num_frames} frames, stats count {count}"

    written = {"png": work / "lerobot_png", "mp4": work / "lerobot_mp4"}
    for kind, out in written.items():

        @check(
            f"[{kind}] lerobot writes the same frames itself (create / add_frame / save_episode)"
        )
        def _write():
            ds = write_with_lerobot(exports["png"], out, use_videos=kind == "mp4")
            return f"{ds.num_episodes} episodes, {ds.num_frames} frames, {len(ds.meta.tasks)} tasks"

    @check("[png] the export's files, columns and types are the ones lerobot writes")
    def _layout():
        return same_layout(exports["png"], written["png"])

    @check("[mp4] the export's files, columns and types are the ones lerobot writes")
    def _layout_mp4():
        return same_layout(exports["mp4"], written["mp4"])

    @check("[png] the export's statistics are lerobot's for the same data")
    def _stats():
        return same_stats(exports["png"], written["png"])

    # AV1 at crf 30 in yuv420p (lerobot's default) changes pixels; PNG keeps them.
    bounds = {"png": ("0", "0"), "mp4": ("8", "255")}
    for kind, out in written.items():

        @check(f"[{kind}] fed-ros dataset import reads lerobot's dataset; one training step")
        def _import():
            target = work / f"imported_{kind}" / "demos"
            fed(
                fed_ros,
                "dataset",
                "import",
                out,
                "--robot-profile",
                "panda_sim",
                "--demo-dir",
                target,
            )
            mean_abs, max_abs = bounds[kind]
            line = fed(
                py,
                helper,
                "check-import",
                demos,
                target,
                "--max-mean-abs",
                mean_abs,
                "--max-abs",
                max_abs,
            )
            report = json.loads(line)
            return (
                f"{report['episodes']} episodes, tasks {report['tasks']}, pixels max |d| "
                f"{report['pixel_max_abs']} mean {report['pixel_mean_abs']:.2f}, "
                f"{report['train_steps']} step loss_bc {report['loss_bc']:.3f}"
            )

    failed = [name for name, ok, _ in RESULTS if not ok]
    print(
        f"\ninterop: {len(RESULTS) - len(failed)} of {len(RESULTS)} checks passed "
        f"in {time.perf_counter() - t_start:.0f} s (lerobot 0.4.4, {work})"
    )
    for name in failed:
        print(f"  FAILED: {name}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
