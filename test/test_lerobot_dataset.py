"""`fed-ros dataset export|import` (LeRobotDataset v3.0): a round trip keeps every frame, action
and instruction; the layout is checked against LeRobot's published schema (lerobot itself needs
Python >= 3.12 or NumPy 2 and cannot share this venv: measured with pip, lerobot 0.6.1 and 0.4.4);
malformed datasets are refused naming the file and the field, with nothing written; a robot's
demonstration loader finds the imported episodes."""

from __future__ import annotations


import json
import sys

import numpy as np
import pytest

from fed_ros.cli import main as fed_ros
from fed_ros.core.data import episode as ep
from fed_ros.core.data.episode import Episode

# The dataset extra (make test installs it); its absence is the last test's subject.
import pandas as pd  # noqa: E402
import pyarrow as pa  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402

# LeRobot's own constants (lerobot/datasets/utils.py, codebase v3.0).
DEFAULT_FEATURES = {"timestamp", "frame_index", "episode_index", "index", "task_index"}
DATA_PATH = "data/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet"
INFO_KEYS = {
    "codebase_version", "robot_type", "total_episodes", "total_frames", "total_tasks",
    "chunks_size", "data_files_size_in_mb", "video_files_size_in_mb", "fps", "splits",
    "data_path", "video_path", "features",
}  # fmt: skip
EPISODE_COLUMNS = {
    "episode_index", "tasks", "length", "data/chunk_index", "data/file_index",
    "dataset_from_index", "dataset_to_index",
}  # fmt: skip


def _episodes(n: int = 3) -> list[Episode]:
    rng = np.random.default_rng(0)
    out = []
    for i in range(n):
        t = 5 + i
        obs = {
            ep.JOINT_POS: rng.normal(size=(t, 7)).astype(np.float32),
            ep.GRIPPER_QPOS: rng.normal(size=(t, 2)).astype(np.float32),
            ep.EEF_POS: rng.normal(size=(t, 3)).astype(np.float32),
            ep.EEF_QUAT: rng.normal(size=(t, 4)).astype(np.float32),
            ep.OBJECT_STATE: rng.normal(size=(t, ep.OBJECT_STATE_DIM)).astype(np.float32),
            ep.AGENTVIEW_IMAGE: rng.integers(0, 256, (t, 84, 84, 3), dtype=np.uint8),
            ep.WRIST_IMAGE: rng.integers(0, 256, (t, 84, 84, 3), dtype=np.uint8),
        }
        instruction = "lift the red cube" if i < 2 else "lift the cube, mirrored mount"
        actions = rng.uniform(-1, 1, (t, 4)).astype(np.float32)
        out.append(Episode("lift", instruction, obs, actions, "default", "robot_0", True))
    return out


@pytest.fixture
def exported(tmp_path):
    demos = tmp_path / "robot_0" / "demos"
    demos.mkdir(parents=True)
    episodes = _episodes()
    for i, e in enumerate(episodes):
        e.save(demos / f"demo_{i}.npz")
    out = tmp_path / "lerobot_robot_0"
    argv = ["dataset", "export", str(demos), str(out), "--robot-profile", "panda_sim"]
    assert fed_ros(argv) == 0
    return episodes, out


def test_export_has_lerobots_v3_layout(exported):
    episodes, out = exported
    info = json.loads((out / "meta/info.json").read_text())
    assert set(info) == INFO_KEYS and info["codebase_version"] == "v3.0"
    assert info["fps"] == 20.0 and info["robot_type"] == "panda_sim"
    assert info["data_path"] == DATA_PATH and info["video_path"] is None
    frames = sum(len(e) for e in episodes)
    assert (info["total_episodes"], info["total_frames"], info["total_tasks"]) == (3, frames, 2)
    feats = info["features"]
    assert DEFAULT_FEATURES <= set(feats) and all("/" not in name for name in feats)
    assert feats["observation.state"]["names"][:2] == ["robot0_joint1", "robot0_joint2"]
    assert feats["observation.state"]["shape"] == [16]
    assert feats["observation.images.agentview"] == {
        "dtype": "image",
        "shape": [84, 84, 3],
        "names": ["height", "width", "channels"],
    }
    data = pq.read_table(out / DATA_PATH.format(chunk_index=0, file_index=0))
    assert set(data.column_names) == set(feats) and data.num_rows == frames
    assert data.column("index").to_pylist() == list(range(frames))
    # Image cells are HF datasets' Image storage: {bytes: PNG, path}.
    cell = data.column("observation.images.wrist")[0].as_py()
    assert cell["bytes"][:8] == b"\x89PNG\r\n\x1a\n" and cell["path"] is None
    eps = pq.read_table(out / "meta/episodes/chunk-000/file-000.parquet").to_pydict()
    assert EPISODE_COLUMNS <= set(eps) and eps["length"] == [5, 6, 7]
    assert eps["dataset_from_index"] == [0, 5, 11] and eps["dataset_to_index"] == [5, 11, 18]
    tasks = pd.read_parquet(out / "meta/tasks.parquet")  # as LeRobot reads it
    assert tasks.index.name == "task"
    assert int(tasks.loc["lift the red cube", "task_index"]) == 1
    assert sorted(tasks["task_index"]) == [0, 1]


def test_round_trip_keeps_every_frame_action_and_instruction(exported, tmp_path):
    episodes, out = exported
    target = tmp_path / "robot_1" / "demos"
    argv = [
        "dataset",
        "import",
        str(out),
        "--robot-profile",
        "panda_sim",
        "--demo-dir",
        str(target),
    ]
    assert fed_ros(argv) == 0
    from fed_ros.ros.arm.driving import local_episodes  # what the robot node trains on

    back = local_episodes(target)
    assert len(back) == len(episodes)
    for a, b in zip(episodes, back):
        assert (a.task, a.instruction, a.variation, a.robot_id) == (
            b.task, b.instruction, b.variation, b.robot_id
        )  # fmt: skip
        assert np.array_equal(a.actions, b.actions)
        assert set(a.observations) == set(b.observations)
        for key, value in a.observations.items():
            assert np.array_equal(value, b.observations[key]), key
    assert fed_ros(argv) == 2  # a second import under the same names is refused


def _import(tmp_path, dataset, profile="panda_sim"):
    target = tmp_path / "target_demos"
    argv = ["dataset", "import", str(dataset), "--robot-profile", profile]
    return fed_ros([*argv, "--demo-dir", str(target)]), target


def _nothing_written(target) -> bool:
    return not target.exists() or not [p for p in target.rglob("*") if p.is_file()]


def test_missing_info_json_is_refused_naming_the_file(exported, tmp_path, capsys):
    _, out = exported
    (out / "meta/info.json").unlink()
    code, target = _import(tmp_path, out)
    assert code == 2 and _nothing_written(target)
    err = capsys.readouterr().err
    assert f"{out / 'meta/info.json'}: missing" in err and err.count("\n") == 1


def test_features_of_another_arm_are_refused_naming_the_field(exported, tmp_path, capsys):
    _, out = exported
    code, target = _import(tmp_path, out, profile="ur5e")
    assert code == 2 and _nothing_written(target)
    err = capsys.readouterr().err
    assert "features.observation.state.names" in err and "'ur5e'" in err


def test_a_truncated_image_is_refused_naming_episode_and_frame(exported, tmp_path, capsys):
    _, out = exported
    path = out / DATA_PATH.format(chunk_index=0, file_index=0)
    table = pq.read_table(path)
    cells = table.column("observation.images.agentview").to_pylist()
    cells[7] = {"bytes": cells[7]["bytes"][:100], "path": None}  # episode 1, frame 2
    column = table.column_names.index("observation.images.agentview")
    table = table.set_column(
        column, "observation.images.agentview", pa.array(cells, type=table.schema[column].type)
    )
    pq.write_table(table, path)
    code, target = _import(tmp_path, out)
    assert code == 2 and _nothing_written(target)
    err = capsys.readouterr().err
    assert "observation.images.agentview of episode 1 frame 2 does not decode" in err


def test_export_refuses_a_non_empty_folder_and_writes_nothing_half(tmp_path, capsys):
    demos = tmp_path / "demos"
    demos.mkdir()
    _episodes(1)[0].save(demos / "d.npz")
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    argv = ["dataset", "export", str(demos), str(out), "--robot-profile", "panda_sim"]
    assert fed_ros(argv) == 2
    assert "exists and is not empty" in capsys.readouterr().err
    assert [p.name for p in out.iterdir()] == ["keep.txt"]
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".out.")]  # no temp left


def test_without_the_dataset_extra_one_line_names_the_install(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "pyarrow", None)
    code, _ = _import(tmp_path, tmp_path)
    assert code == 2
    assert capsys.readouterr().err == (
        "fed-ros dataset: LeRobot dataset conversion needs pyarrow: "
        "pip install 'fed_ros[dataset]' (or: pip install 'pyarrow<21' 'pandas<2.3' Pillow)\n"
    )
