"""Episodes <-> LeRobotDataset (codebase v3.0, the layout of lerobot 0.4+), on disk.

Written as lerobot 0.4.4 writes it (`lerobot/datasets/lerobot_dataset.py`, `utils.py`): its
tools (LeRobotDataset, the ACT pre-processor, `aggregate_datasets`, `delete_episodes`, appending
an episode) run on the export as on a dataset lerobot recorded (`make interop` checks each):

    meta/info.json            codebase_version "v3.0", fps (an int), robot_type, features,
                              totals, chunks_size, file sizes, data_path, video_path
    meta/stats.json           every feature's statistics over the dataset (lerobot_stats.py)
    meta/tasks.parquet        one row per instruction: task_index, indexed (unnamed) by the text
    meta/episodes/chunk-000/file-000.parquet
                              per episode, in lerobot's column order: episode_index, tasks,
                              length, data/chunk_index, data/file_index, dataset_from_index,
                              dataset_to_index, videos/<camera>/{chunk_index, file_index,
                              from_timestamp, to_timestamp}, stats/<feature>/<stat>,
                              meta/episodes/chunk_index, meta/episodes/file_index, then
                              fed_ros/* (task family, variation, robot, success)
    data/chunk-000/file-000.parquet
                              one row per frame: the features below plus timestamp,
                              frame_index, episode_index, index, task_index; the "huggingface"
                              schema metadata names each column's type for HF datasets
    videos/<camera>/chunk-000/file-000.mp4   (cameras as mp4 only; lerobot_video.py)

Features: ``observation.state`` (the arm's joints, gripper joints, end-effector position and
xyzw quaternion; named through the arm profile), ``observation.environment_state`` (object
state, simulation only), ``observation.images.<camera>`` (one per profile camera) and ``action``
(dx, dy, dz, gripper). Cameras are PNG in the parquet (dtype ``image``) or, with
``cameras="mp4"``, lossless H.264 (dtype ``video``); both keep every pixel.

Time: ``timestamp`` is ``frame_index / fps``, the control clock. Step k of a recording is the
k-th control tick (the applied command stamped s_k, docs/arms.md); a lockstep simulator advances
exactly one control period per tick whatever the wall clock does, so the recording's header
stamps (wall time, irregular while the simulator waits for the policy) are not the arm's time.
lerobot needs this regular clock: it finds a video frame at ``from_timestamp + timestamp``.

Import checks everything before writing anything: a missing ``meta/info.json``, a codebase
version or feature that does not match the arm profile, a frame count that disagrees with the
episode index, or an image that does not decode is refused naming the file and the field; the
episodes are then written to a temporary folder and moved into place only when all are done.
pyarrow, pandas, Pillow and PyAV are the optional ``dataset`` extra, imported when a conversion
runs.
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
from numpy.typing import NDArray
from tqdm.auto import tqdm

from fed_ros.core.data import episode as ep
from fed_ros.core.data import lerobot_stats as st
from fed_ros.core.data.episode import Episode
from fed_ros.core.extras import require

CODEBASE_VERSION = "v3.0"
DATA_PATH = "data/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet"
VIDEO_PATH = "videos/{video_key}/chunk-{chunk_index:03d}/file-{file_index:03d}.mp4"
DATA_FILE = DATA_PATH.format(chunk_index=0, file_index=0)
EPISODES_FILE = "meta/episodes/chunk-000/file-000.parquet"
TASKS_FILE = "meta/tasks.parquet"
INFO_FILE = "meta/info.json"
STATS_FILE = "meta/stats.json"
ACTION_NAMES = ["dx", "dy", "dz", "gripper"]
EEF_NAMES = ["eef_x", "eef_y", "eef_z", "eef_qx", "eef_qy", "eef_qz", "eef_qw"]
STATE_KEYS = (ep.JOINT_POS, ep.GRIPPER_QPOS, ep.EEF_POS, ep.EEF_QUAT)
DEFAULT_FEATURES = ("timestamp", "frame_index", "episode_index", "index", "task_index")
CAMERA_FORMATS = ("png", "mp4")
FED_ROS_COLUMNS = ("task", "variation", "robot_id", "success")


class DatasetError(ValueError):
    """A dataset that cannot be converted: the message names the file and the field."""


def conversion_modules() -> tuple[Any, Any, Any, Any]:
    """pyarrow, pyarrow.parquet, PIL.Image and pandas, or MissingExtra naming the install."""
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


def lerobot_fps(fps: float, source: str = "--fps") -> int:
    """``fps`` as LeRobot stores it, a positive int; else DatasetError naming ``source``."""
    if not np.isfinite(fps) or fps <= 0 or float(fps) != int(fps):
        raise DatasetError(
            f"{source} {fps:g}: LeRobot's fps is a positive whole number of frames per second"
        )
    return int(fps)


def features_for(profile: Any, first: Episode, cameras: str = "png") -> dict[str, dict[str, Any]]:
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
                "dtype": "video" if cameras == "mp4" else "image",
                "shape": [int(h), int(w), int(c)],
                "names": ["height", "width", "channels"],
            }
    feats["action"] = {"dtype": "float32", "shape": [ep.ACTION_DIM], "names": ACTION_NAMES}
    for name in DEFAULT_FEATURES:
        kind = "float32" if name == "timestamp" else "int64"
        feats[name] = {"dtype": kind, "shape": [1], "names": None}
    return feats


def hf_features(feats: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """The data parquet's "huggingface" schema metadata (HF datasets' Features), video left out."""
    out: dict[str, dict[str, Any]] = {}
    for name, f in feats.items():
        if f["dtype"] == "image":
            out[name] = {"_type": "Image"}
        elif f["dtype"] != "video":
            value = {"dtype": f["dtype"], "_type": "Value"}
            out[name] = (
                value
                if f["shape"] == [1]
                else {"feature": value, "length": f["shape"][0], "_type": "List"}
            )
    return out


def _png(pil: Any, frame: NDArray[Any]) -> bytes:
    buf = io.BytesIO()
    pil.fromarray(np.ascontiguousarray(frame)).save(buf, format="PNG")
    return buf.getvalue()


def _frame_columns(
    episode: Episode, feats: dict[str, Any], cams: dict[str, str]
) -> dict[str, NDArray[Any]]:
    """One episode's values per feature (cameras as frames), before indices are added."""
    state = np.concatenate([episode.observations[k].astype(np.float32) for k in STATE_KEYS], 1)
    out = {"observation.state": state}
    if "observation.environment_state" in feats:
        out["observation.environment_state"] = episode.observations[ep.OBJECT_STATE].astype(
            np.float32
        )
    out.update({feature: episode.observations[key] for feature, key in cams.items()})
    out["action"] = episode.actions.astype(np.float32)
    return out


def _arrow_column(pa: Any, name: str, f: dict[str, Any], values: list[Any]) -> Any:
    if f["dtype"] == "image":
        return pa.array(values, type=pa.struct([("bytes", pa.binary()), ("path", pa.string())]))
    if f["shape"] == [1]:
        return pa.array(values, type=pa.float32() if name == "timestamp" else pa.int64())
    return pa.array(list(np.stack(values)), type=pa.list_(pa.float32(), f["shape"][0]))


def export_lerobot(
    episodes: Sequence[Episode],
    profile: Any,
    out: Path,
    fps: float | None = None,
    cameras: str = "png",
) -> dict[str, Any]:
    """Write ``episodes`` as a LeRobotDataset at ``out`` (a new or empty folder); returns info.

    ``cameras`` is "png" (in the parquet) or "mp4" (lossless video files). Written into a
    temporary sibling folder and renamed at the end: a failure leaves nothing.
    """
    pa, pq, pil, pd = conversion_modules()
    out = Path(out)
    if not episodes:
        raise DatasetError("no episodes to export (successful demonstrations only)")
    if cameras not in CAMERA_FORMATS:
        raise DatasetError(f"--cameras {cameras!r}: one of {', '.join(CAMERA_FORMATS)}")
    if out.exists() and any(out.iterdir()):
        raise DatasetError(f"{out}: exists and is not empty; choose a new folder")
    if fps is None:
        # A profile's rate may be fractional; LeRobot's fps may not (then --fps chooses one).
        fps = lerobot_fps(profile.control_rate_hz, f"arm profile {profile.name!r} control_rate_hz")
    else:
        fps = lerobot_fps(fps)
    feats = features_for(profile, episodes[0], cameras)
    cams = {f: k for f, k in camera_keys(profile).items() if f in feats}
    videos = [f for f in cams if feats[f]["dtype"] == "video"]
    tasks = sorted({e.instruction for e in episodes})
    task_index = {t: i for i, t in enumerate(tasks)}
    columns: dict[str, list[Any]] = {name: [] for name in feats if name not in videos}
    rows: dict[str, list[Any]] = {}
    per_episode_stats = []
    tmp = Path(
        tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent if out.parent.exists() else None)
    )
    try:
        writers = {}
        if videos:
            from fed_ros.core.data.lerobot_video import Mp4Writer

            for f in videos:
                h, w = feats[f]["shape"][:2]
                path = tmp / VIDEO_PATH.format(video_key=f, chunk_index=0, file_index=0)
                writers[f] = Mp4Writer(path, fps, h, w)
        index = 0
        # A bar with an ETA in a terminal (tqdm's disable=None: silent when not a TTY).
        bar = tqdm(episodes, desc="export episodes", unit="episode", leave=False, disable=None)
        for e_idx, episode in enumerate(bar):
            n = len(episode)
            values = _frame_columns(episode, feats, cams)
            width = values["observation.state"].shape[1]
            if width != feats["observation.state"]["shape"][0]:
                raise DatasetError(f"episode {e_idx}: observation.state width {width}")
            frame_index = np.arange(n, dtype=np.int64)
            # The control clock, as lerobot's add_frame stamps a frame (module docstring).
            values["timestamp"] = (frame_index / fps).astype(np.float32)
            values["frame_index"] = frame_index
            values["episode_index"] = np.full(n, e_idx, dtype=np.int64)
            values["index"] = np.arange(index, index + n, dtype=np.int64)
            values["task_index"] = np.full(n, task_index[episode.instruction], dtype=np.int64)
            row: dict[str, Any] = {
                "episode_index": e_idx,
                "tasks": [episode.instruction],
                "length": n,
                "data/chunk_index": 0,
                "data/file_index": 0,
                "dataset_from_index": index,
                "dataset_to_index": index + n,
            }
            for f in videos:
                start, stop = writers[f].append(values[f])
                row.update(
                    {
                        f"videos/{f}/chunk_index": 0,
                        f"videos/{f}/file_index": 0,
                        f"videos/{f}/from_timestamp": start,
                        f"videos/{f}/to_timestamp": stop,
                    }
                )
            stats = {
                name: st.image_stats(values[name])
                if name in cams
                else st.vector_stats(values[name])
                for name in feats
            }
            per_episode_stats.append(stats)
            row.update({k: v[0] for k, v in st.stats_columns([stats]).items()})
            row.update({"meta/episodes/chunk_index": 0, "meta/episodes/file_index": 0})
            for key in FED_ROS_COLUMNS:
                row[f"fed_ros/{key}"] = getattr(episode, key)
            row["fed_ros/success"] = bool(episode.success)
            for key, value in row.items():
                rows.setdefault(key, []).append(value)
            for name in columns:
                if name in cams:
                    columns[name] += [{"bytes": _png(pil, f), "path": None} for f in values[name]]
                else:
                    columns[name] += list(values[name])
            index += n
        for f, writer in writers.items():
            writer.close()
            from fed_ros.core.data.lerobot_video import video_info

            feats[f]["info"] = video_info(writer.path)
        info = {
            "codebase_version": CODEBASE_VERSION,
            "robot_type": profile.name,
            "total_episodes": len(episodes),
            "total_frames": index,
            "total_tasks": len(tasks),
            "chunks_size": 1000,
            "data_files_size_in_mb": 100,
            "video_files_size_in_mb": 200,
            "fps": fps,
            "splits": {"train": f"0:{len(episodes)}"},
            "data_path": DATA_PATH,
            "video_path": VIDEO_PATH if videos else None,
            "features": feats,
        }
        for rel in (DATA_FILE, EPISODES_FILE, TASKS_FILE, INFO_FILE):
            (tmp / rel).parent.mkdir(parents=True, exist_ok=True)
        table = pa.table({n: _arrow_column(pa, n, feats[n], v) for n, v in columns.items()})
        meta = {b"huggingface": json.dumps({"info": {"features": hf_features(feats)}}).encode()}
        pq.write_table(table.replace_schema_metadata(meta), tmp / DATA_FILE)
        # As lerobot writes it: Table.from_pydict of plain lists (list<double> statistics).
        pq.write_table(pa.Table.from_pydict(rows), tmp / EPISODES_FILE)
        # As lerobot writes it: a DataFrame indexed, without an index name, by the task text.
        pd.DataFrame({"task_index": np.arange(len(tasks), dtype=np.int64)}, index=tasks).to_parquet(
            tmp / TASKS_FILE
        )
        (tmp / INFO_FILE).write_text(json.dumps(info, indent=4))
        stats_all = st.stats_json(st.aggregate_stats(per_episode_stats))
        (tmp / STATS_FILE).write_text(json.dumps(stats_all, indent=4))
        if out.exists():
            out.rmdir()  # empty (checked above)
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp.rename(out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return info
