"""LeRobotDataset (codebase v3.0) -> episodes, checked against the arm profile before anything is
written (the layout: :mod:`fed_ros.core.data.lerobot`).

A dataset fed_ros wrote carries each episode's task family, variation, robot and success in
``fed_ros/*`` columns; one lerobot (or anyone else) wrote has only its task strings, which then
become both the episode's task and its instruction. Cameras are read from PNG cells or mp4
files (any codec PyAV decodes), a frame at ``from_timestamp + timestamp`` of its episode."""

from __future__ import annotations

import io
import json
import shutil
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray
from tqdm.auto import tqdm

from fed_ros.core.data import episode as ep
from fed_ros.core.data.episode import Episode
from fed_ros.core.data.lerobot import (
    CODEBASE_VERSION,
    DatasetError,
    INFO_FILE,
    STATE_KEYS,
    TASKS_FILE,
    VIDEO_PATH,
    conversion_modules,
    camera_keys,
    state_names,
)

CAMERA_DTYPES = ("image", "video")


def _read_json(path: Path) -> dict[str, Any]:
    if not path.is_file():
        raise DatasetError(f"{path}: missing (not a LeRobot dataset?)")
    try:
        content: dict[str, Any] = json.loads(path.read_text())
        return content
    except (OSError, ValueError) as err:
        raise DatasetError(f"{path}: not readable JSON ({err})") from None


def _check_features(info: dict[str, Any], profile: Any, where: Path) -> dict[str, str]:
    """The camera features to read (feature -> episode key); DatasetError naming the field."""
    version = info.get("codebase_version")
    if version != CODEBASE_VERSION:
        raise DatasetError(
            f"{where}: codebase_version {version!r}, this reader knows {CODEBASE_VERSION!r}"
        )
    feats = info.get("features")
    if not isinstance(feats, dict):
        raise DatasetError(f"{where}: features missing or not a mapping")
    for name in ("observation.state", "action"):
        if name not in feats:
            raise DatasetError(f"{where}: features.{name} missing")
    names = list(feats["observation.state"].get("names") or [])
    want = state_names(profile)
    if names != want:
        raise DatasetError(
            f"{where}: features.observation.state.names {names} do not match arm profile "
            f"{profile.name!r} ({want})"
        )
    action = feats["action"].get("shape")
    if list(action or []) != [ep.ACTION_DIM]:
        raise DatasetError(f"{where}: features.action.shape {action}, expected [{ep.ACTION_DIM}]")
    cams = {}
    known = camera_keys(profile)
    for name, feat in feats.items():
        if not name.startswith("observation.images."):
            continue
        if name not in known:
            raise DatasetError(
                f"{where}: features.{name} is not a camera of arm profile {profile.name!r} "
                f"({sorted(known)})"
            )
        if feat.get("dtype") not in CAMERA_DTYPES:
            raise DatasetError(
                f"{where}: features.{name}.dtype {feat.get('dtype')!r}: a camera is one of "
                f"{CAMERA_DTYPES}"
            )
        cams[name] = known[name]
    return cams


class _Videos:
    """Decoded mp4 frames of a dataset, each file decoded once, looked up by time."""

    def __init__(self, root: Path, fps: int) -> None:
        self.root, self.fps = root, fps
        self._files: dict[Path, dict[int, NDArray[Any]]] = {}

    def frames(
        self, feature: str, meta: dict[str, list[Any]], i: int, times: list[float]
    ) -> NDArray[Any]:
        """Episode row ``i``'s frames of ``feature`` at its data ``times`` (seconds)."""
        from fed_ros.core.data.lerobot_video import decode_frames

        chunk = meta[f"videos/{feature}/chunk_index"][i]
        file = meta[f"videos/{feature}/file_index"][i]
        start = meta[f"videos/{feature}/from_timestamp"][i]
        path = self.root / VIDEO_PATH.format(video_key=feature, chunk_index=chunk, file_index=file)
        if path not in self._files:
            try:
                frames, at = decode_frames(path)
            except (OSError, ValueError) as err:  # PyAV's errors are OSError/ValueError
                raise DatasetError(f"{path}: does not decode ({err})") from None
            self._files[path] = {int(round(t * self.fps)): f for t, f in zip(at, frames)}
        by_tick = self._files[path]
        out = []
        for frame_index, t in enumerate(times):
            tick = int(round((start + t) * self.fps))
            if tick not in by_tick:
                raise DatasetError(
                    f"{path}: no frame at {start + t:.4f} s for {feature} of episode "
                    f"{meta['episode_index'][i]} frame {frame_index}"
                )
            out.append(by_tick[tick])
        return np.stack(out)


def read_lerobot(root: Path, profile: Any) -> list[Episode]:
    """Every episode of the LeRobot dataset at ``root``, checked against ``profile``."""
    pa, pq, pil, pd = conversion_modules()
    root = Path(root)
    info = _read_json(root / INFO_FILE)
    cams = _check_features(info, profile, root / INFO_FILE)
    data_files = sorted((root / "data").glob("chunk-*/file-*.parquet"))
    if not data_files:
        raise DatasetError(f"{root / 'data'}: no chunk-*/file-*.parquet")
    try:
        table = pa.concat_tables([pq.read_table(f) for f in data_files])
        episodes_meta = pa.concat_tables(
            [
                pq.read_table(f)
                for f in sorted((root / "meta/episodes").glob("chunk-*/file-*.parquet"))
            ]
        ).to_pydict()
        tasks = pd.read_parquet(root / TASKS_FILE)
    except (OSError, ValueError, pa.ArrowException) as err:
        raise DatasetError(f"{root}: parquet not readable ({err})") from None
    task_text = {int(row.task_index): str(text) for text, row in tasks.iterrows()}
    videos = _Videos(root, int(info.get("fps") or 0) or 1)
    cols = table.to_pydict()
    total = info.get("total_frames")
    if total != table.num_rows:
        raise DatasetError(
            f"{root / INFO_FILE}: total_frames {total} but the data has {table.num_rows} frames"
        )
    names = state_names(profile)
    widths = [len(profile.joints.names), len(profile.gripper.joint_names), 3, 4]
    out = []
    indices = episodes_meta.get("episode_index", [])
    bar = tqdm(indices, desc="import episodes", unit="episode", leave=False, disable=None)
    for i, e_idx in enumerate(bar):
        lo, hi = episodes_meta["dataset_from_index"][i], episodes_meta["dataset_to_index"][i]
        rows = [r for r in range(lo, hi)]
        if hi > table.num_rows or lo >= hi or any(cols["episode_index"][r] != e_idx for r in rows):
            raise DatasetError(
                f"{root / 'meta/episodes'}: episode {e_idx} rows {lo}:{hi} do not match the data"
            )
        state = np.asarray([cols["observation.state"][r] for r in rows], np.float32)
        if state.shape != (len(rows), len(names)):
            raise DatasetError(f"episode {e_idx}: observation.state shape {state.shape}")
        obs: dict[str, NDArray[Any]] = {}
        start = 0
        for key, width in zip(STATE_KEYS, widths):
            obs[key] = state[:, start : start + width]
            start += width
        if "observation.environment_state" in cols:
            obs[ep.OBJECT_STATE] = np.asarray(
                [cols["observation.environment_state"][r] for r in rows], np.float32
            )
        for feature, key in cams.items():
            if info["features"][feature]["dtype"] == "video":
                times = [float(cols["timestamp"][r]) for r in rows]
                obs[key] = videos.frames(feature, episodes_meta, i, times).astype(np.uint8)
                continue
            frames = []
            for r in rows:
                cell = cols[feature][r] or {}
                try:
                    with pil.open(io.BytesIO(cell.get("bytes") or b"")) as img:
                        frames.append(np.asarray(img.convert("RGB")))
                except (OSError, ValueError) as err:
                    raise DatasetError(
                        f"{data_files[0].parent.parent}: {feature} of episode {e_idx} frame "
                        f"{cols['frame_index'][r]} does not decode ({err})"
                    ) from None
            obs[key] = np.stack(frames).astype(np.uint8)
        actions = np.asarray([cols["action"][r] for r in rows], np.float32)
        instruction = task_text.get(int(cols["task_index"][lo]))
        if instruction is None:
            raise DatasetError(f"{root / TASKS_FILE}: no task_index {cols['task_index'][lo]}")
        kinds = {task_text.get(int(cols["task_index"][r])) for r in rows}
        if len(kinds) > 1:
            raise DatasetError(
                f"episode {e_idx}: {len(kinds)} tasks {sorted(map(str, kinds))}; a fed_ros "
                "episode has one instruction"
            )
        meta = {
            k: episodes_meta.get(f"fed_ros/{k}", [None] * (i + 1))[i]
            for k in ("task", "variation", "robot_id", "success")
        }
        try:
            out.append(
                Episode(
                    # Without fed_ros columns, the dataset's own task string (module docstring).
                    task=meta["task"] or instruction,
                    instruction=instruction,
                    observations=obs,
                    actions=actions,
                    variation=meta["variation"] or "default",
                    robot_id=meta["robot_id"] or "",
                    success=True if meta["success"] is None else bool(meta["success"]),
                    metadata={"source": f"lerobot:{root.name}", "lerobot_episode": str(e_idx)},
                )
            )
        except ValueError as err:
            raise DatasetError(f"episode {e_idx}: {err}") from None
    if not out:
        raise DatasetError(f"{root}: no episodes in meta/episodes")
    return out


def write_episodes(episodes: Sequence[Episode], demo_dir: Path, prefix: str) -> list[Path]:
    """Save ``episodes`` as ``<prefix>_<i>.npz`` in ``demo_dir`` (the robot's demonstrations),
    all or none: written in a temporary folder first, then moved in; an existing name is refused."""
    demo_dir = Path(demo_dir)
    names = [f"{prefix}_{i:04d}.npz" for i in range(len(episodes))]
    taken = [n for n in names if (demo_dir / n).exists()]
    if taken:
        raise DatasetError(f"{demo_dir}: {taken[0]} exists; import under another --prefix")
    demo_dir.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".import.", dir=demo_dir))
    try:
        for name, episode in zip(names, episodes):
            episode.save(tmp / name)
        for name in names:
            (tmp / name).rename(demo_dir / name)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return [demo_dir / n for n in names]
