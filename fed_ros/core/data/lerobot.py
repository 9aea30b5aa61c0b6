"""Episodes <-> LeRobotDataset (codebase v3.0, the layout of lerobot 0.4+), on disk.

Layout written (the names are LeRobot's, `lerobot/datasets/utils.py`):

    meta/info.json                          codebase_version "v3.0", fps, robot_type, features,
                                            totals, chunks_size, data_path, video_path null
    meta/tasks.parquet                      one row per instruction: task_index, index = task
    meta/episodes/chunk-000/file-000.parquet  per episode: episode_index, tasks, length,
                                            data/chunk_index, data/file_index,
                                            dataset_from_index, dataset_to_index, plus fed_ros/*
                                            columns (task family, variation, robot, success)
    data/chunk-000/file-000.parquet         one row per frame: the features below plus
                                            timestamp, frame_index, episode_index, index,
                                            task_index

Features: ``observation.state`` (the arm's joints, gripper joints, end-effector position and
xyzw quaternion; named through the arm profile), ``observation.environment_state`` (object
state, simulation only), ``observation.images.<camera>`` (dtype ``image``: PNG bytes in the
parquet, lossless, one per profile camera) and ``action`` (dx, dy, dz, gripper). Cameras
travel as PNG rather than mp4 so a round trip keeps every pixel.

Import checks everything before writing anything: a missing ``meta/info.json``, a codebase
version or feature that does not match the arm profile, a frame count that disagrees with the
episode index, or an image that does not decode is refused naming the file and the field; the
episodes are then written to a temporary folder and moved into place only when all are done.
pyarrow and Pillow are the optional ``dataset`` extra, imported when a conversion runs.
"""

from __future__ import annotations

import io
import json
import shutil
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from tqdm.auto import tqdm

from fed_ros.core.data import episode as ep
from fed_ros.core.data.episode import Episode
from fed_ros.core.extras import require

CODEBASE_VERSION = "v3.0"
DATA_FILE = "data/chunk-000/file-000.parquet"
EPISODES_FILE = "meta/episodes/chunk-000/file-000.parquet"
TASKS_FILE = "meta/tasks.parquet"
INFO_FILE = "meta/info.json"
ACTION_NAMES = ["dx", "dy", "dz", "gripper"]
EEF_NAMES = ["eef_x", "eef_y", "eef_z", "eef_qx", "eef_qy", "eef_qz", "eef_qw"]
STATE_KEYS = (ep.JOINT_POS, ep.GRIPPER_QPOS, ep.EEF_POS, ep.EEF_QUAT)
DEFAULT_FEATURES = ("timestamp", "frame_index", "episode_index", "index", "task_index")


class DatasetError(ValueError):
    """A dataset that cannot be converted: the message names the file and the field."""


def conversion_modules() -> tuple[Any, Any, Any, Any]:
    what = "LeRobot dataset conversion"
    pa = require("pyarrow", "dataset", what)
    pq = require("pyarrow.parquet", "dataset", what)
    pil = require("PIL.Image", "dataset", what)
    pd = require("pandas", "dataset", what)
    return pa, pq, pil, pd


def state_names(profile: Any) -> list[str]:
    """Names of ``observation.state``'s entries, through the arm profile."""
    return [*profile.joints.names, *profile.gripper.joint_names, *EEF_NAMES]


def camera_keys(profile: Any) -> dict[str, str]:
    """LeRobot feature -> episode observation key, for each profile camera with a recording."""
    out = {}
    for camera in profile.cameras:
        key = f"{camera}_image"
        if key in ep.IMAGE_KEYS:
            out[f"observation.images.{camera}"] = key
    return out


def features_for(profile: Any, first: Episode) -> dict[str, dict[str, Any]]:
    """The dataset's features for episodes shaped like ``first`` on arm ``profile``."""
    names = state_names(profile)
    width = sum(first.observations[k].shape[1] for k in STATE_KEYS)
    if width != len(names):
        raise DatasetError(
            f"observation.state: the episodes have {width} state values, the profile "
            f"{profile.name!r} names {len(names)} ({names})"
        )
    feats: dict[str, dict[str, Any]] = {
        "observation.state": {"dtype": "float32", "shape": [len(names)], "names": names},
    }
    if ep.OBJECT_STATE in first.observations:
        feats["observation.environment_state"] = {
            "dtype": "float32",
            "shape": [ep.OBJECT_STATE_DIM],
            "names": None,
        }
    for feature, key in camera_keys(profile).items():
        if key in first.observations:
            h, w, c = first.observations[key].shape[1:]
            feats[feature] = {
                "dtype": "image",
                "shape": [int(h), int(w), int(c)],
                "names": ["height", "width", "channels"],
            }
    feats["action"] = {"dtype": "float32", "shape": [ep.ACTION_DIM], "names": ACTION_NAMES}
    for name in DEFAULT_FEATURES:
        kind = "float32" if name == "timestamp" else "int64"
        feats[name] = {"dtype": kind, "shape": [1], "names": None}
    return feats


def _png(pil: Any, frame: np.ndarray) -> bytes:
    buf = io.BytesIO()
    pil.fromarray(np.ascontiguousarray(frame)).save(buf, format="PNG")
    return buf.getvalue()


def export_lerobot(
    episodes: Sequence[Episode], profile: Any, out: Path, fps: float | None = None
) -> dict[str, Any]:
    """Write ``episodes`` as a LeRobotDataset at ``out`` (a new or empty folder); returns info.

    Written into a temporary sibling folder and renamed at the end: a failure leaves nothing.
    """
    pa, pq, pil, pd = conversion_modules()
    out = Path(out)
    if not episodes:
        raise DatasetError("no episodes to export (successful demonstrations only)")
    if out.exists() and any(out.iterdir()):
        raise DatasetError(f"{out}: exists and is not empty; choose a new folder")
    fps = float(fps or profile.control_rate_hz)
    feats = features_for(profile, episodes[0])
    cams = {f: k for f, k in camera_keys(profile).items() if f in feats}
    tasks = sorted({e.instruction for e in episodes})
    task_index = {t: i for i, t in enumerate(tasks)}
    columns: dict[str, list] = {name: [] for name in feats}
    ep_rows: dict[str, list] = {
        k: []
        for k in (
            "episode_index",
            "tasks",
            "length",
            "data/chunk_index",
            "data/file_index",
            "dataset_from_index",
            "dataset_to_index",
            "fed_ros/task",
            "fed_ros/variation",
            "fed_ros/robot_id",
            "fed_ros/success",
        )
    }
    index = 0
    # A bar with an ETA in a terminal (tqdm's disable=None: silent when not a TTY).
    bar = tqdm(episodes, desc="export episodes", unit="episode", leave=False, disable=None)
    for e_idx, episode in enumerate(bar):
        n = len(episode)
        state = np.concatenate(
            [episode.observations[k].astype(np.float32) for k in STATE_KEYS], axis=1
        )
        if state.shape[1] != len(feats["observation.state"]["names"]):
            raise DatasetError(f"episode {e_idx}: observation.state width {state.shape[1]}")
        columns["observation.state"] += list(state)
        if "observation.environment_state" in feats:
            columns["observation.environment_state"] += list(
                episode.observations[ep.OBJECT_STATE].astype(np.float32)
            )
        for feature, key in cams.items():
            columns[feature] += [
                {"bytes": _png(pil, f), "path": None} for f in episode.observations[key]
            ]
        columns["action"] += list(episode.actions.astype(np.float32))
        columns["timestamp"] += [np.float32(i / fps) for i in range(n)]
        columns["frame_index"] += list(range(n))
        columns["episode_index"] += [e_idx] * n
        columns["index"] += list(range(index, index + n))
        columns["task_index"] += [task_index[episode.instruction]] * n
        for key, value in (
            ("episode_index", e_idx),
            ("tasks", [episode.instruction]),
            ("length", n),
            ("data/chunk_index", 0),
            ("data/file_index", 0),
            ("dataset_from_index", index),
            ("dataset_to_index", index + n),
            ("fed_ros/task", episode.task),
            ("fed_ros/variation", episode.variation),
            ("fed_ros/robot_id", episode.robot_id),
            ("fed_ros/success", bool(episode.success)),
        ):
            ep_rows[key].append(value)
        index += n
    info = {
        "codebase_version": CODEBASE_VERSION,
        "robot_type": profile.name,
        "total_episodes": len(episodes),
        "total_frames": index,
        "total_tasks": len(tasks),
        "chunks_size": 1000,
        "data_files_size_in_mb": 100,
        "video_files_size_in_mb": 500,
        "fps": fps,
        "splits": {"train": f"0:{len(episodes)}"},
        "data_path": "data/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet",
        "video_path": None,
        "features": feats,
    }
    tmp = Path(
        tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent if out.parent.exists() else None)
    )
    try:
        for rel in (DATA_FILE, EPISODES_FILE, TASKS_FILE, INFO_FILE):
            (tmp / rel).parent.mkdir(parents=True, exist_ok=True)
        arrays = {}
        for name, values in columns.items():
            f = feats[name]
            if f["dtype"] == "image":
                arrays[name] = pa.array(
                    values, type=pa.struct([("bytes", pa.binary()), ("path", pa.string())])
                )
            elif f["shape"] == [1]:
                arrays[name] = pa.array(
                    values, type=pa.float32() if name == "timestamp" else pa.int64()
                )
            else:
                arrays[name] = pa.array(
                    [np.asarray(v, np.float32) for v in values],
                    type=pa.list_(pa.float32(), f["shape"][0]),
                )
        pq.write_table(pa.table(arrays), tmp / DATA_FILE)
        pq.write_table(pa.table(ep_rows), tmp / EPISODES_FILE)
        # As LeRobot writes it: a DataFrame indexed by the task text (pandas keeps the index).
        pd.DataFrame(
            {"task_index": np.arange(len(tasks), dtype=np.int64)},
            index=pd.Index(tasks, name="task"),
        ).to_parquet(tmp / TASKS_FILE)
        (tmp / INFO_FILE).write_text(json.dumps(info, indent=4))
        if out.exists():
            out.rmdir()  # empty (checked above)
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp.rename(out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return info
