"""ModelStore: atomic commits, crash at every step, corruption detection, no writes on bad input."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from fed_ros.core.rounds.store import ModelStore
from fed_ros.core.strategies.base import make_strategy

REPO = Path(__file__).resolve().parents[2]


def _models(value: float) -> dict[int, dict[str, np.ndarray]]:
    return {
        c: {
            "temporal.w": np.full((4, 3), value + c, np.float32),
            "head.b": np.full(2, -value, np.float32),
        }
        for c in (0, 1)
    }


def _assign() -> dict[str, list[tuple[int, float]]]:
    return {"robot_0": [(0, 1.0)], "robot_1": [(0, 0.5), (1, 0.5)]}


def _commit(store: ModelStore, r: int) -> None:
    strat = make_strategy("fedavg")
    strat.initialize(_models(float(r))[0], ["robot_0", "robot_1"])
    store.commit(r, _models(float(r)), _assign(), strat.state(), {"note": f"round {r}"})


def test_commit_and_load_roundtrip(tmp_path):
    store = ModelStore(tmp_path)
    assert store.load_latest() is None
    _commit(store, 0)
    _commit(store, 1)
    snap = store.load_latest()
    assert snap.round_idx == 1 and snap.meta == {"note": "round 1"}
    np.testing.assert_array_equal(
        snap.cluster_models[1]["temporal.w"], np.full((4, 3), 2.0, np.float32)
    )
    assert snap.assignments == _assign()
    restored = make_strategy("fedavg")
    restored.load_state(*snap.strategy_state)
    np.testing.assert_array_equal(restored.model_for("robot_0")["head.b"], [-1.0, -1.0])
    assert not any(p.name.endswith(".tmp") for p in tmp_path.rglob("*"))


def test_keep_prunes_old_rounds(tmp_path):
    store = ModelStore(tmp_path, keep=2)
    for r in range(4):
        _commit(store, r)
    assert store.committed_rounds() == [2, 3]


class _Crash(BaseException):
    """Stands in for the process dying (BaseException: nothing may catch it)."""


def _crash_steps(tmp_path) -> list[str]:
    steps: list[str] = []
    ModelStore(tmp_path / "probe", _crash_point=steps.append).commit(
        0, _models(0.0), _assign(), None, {}
    )
    return steps


def test_crash_at_every_step_leaves_previous_round_loadable(tmp_path):
    steps = _crash_steps(tmp_path)
    assert steps[-1] == "committed" and "written:manifest" in steps and "renamed:meta.json" in steps
    for i, step in enumerate(steps):
        d = tmp_path / f"s{i}"
        _commit(ModelStore(d), 0)

        def crash(at, target=step):
            if at == target:
                raise _Crash(at)

        with pytest.raises(_Crash):
            ModelStore(d, _crash_point=crash).commit(
                1, _models(1.0), _assign(), None, {"note": "round 1"}
            )
        snap = ModelStore(d).load_latest()
        committed = steps.index(step) >= steps.index("renamed:manifest")
        assert snap.round_idx == (1 if committed else 0), step
        assert snap.cluster_models[0]["temporal.w"][0, 0] == float(snap.round_idx)
        # The next commit after a crash succeeds and wins.
        _commit(ModelStore(d), 2)
        assert ModelStore(d).load_latest().round_idx == 2


def test_real_kill_between_rename_and_manifest(tmp_path):
    code = textwrap.dedent(f"""
        import os, sys
        import numpy as np
        sys.path.insert(0, {str(REPO)!r})
        from fed_ros.core.rounds.store import ModelStore
        m = {{0: {{"w": np.full(3, 1.0, np.float32)}}}}
        ModelStore({str(tmp_path)!r}).commit(
            0, {{0: {{"w": np.zeros(3, np.float32)}}}}, {{}}, None, {{}}
        )
        def die(step):
            if step == "written:manifest":
                os._exit(9)   # like SIGKILL: no cleanup, no flush of Python state
        ModelStore({str(tmp_path)!r}, _crash_point=die).commit(1, m, {{}}, None, {{}})
    """)
    proc = subprocess.run([sys.executable, "-c", code], timeout=60)
    assert proc.returncode == 9
    snap = ModelStore(tmp_path).load_latest()
    assert snap.round_idx == 0 and not snap.cluster_models[0]["w"].any()


def test_flipped_byte_is_detected_and_never_used(tmp_path, caplog):
    store = ModelStore(tmp_path)
    _commit(store, 0)
    _commit(store, 1)
    path = tmp_path / "round_00000001" / "cluster_1.npy"
    raw = bytearray(path.read_bytes())
    raw[-3] ^= 0x40
    path.write_bytes(bytes(raw))
    with caplog.at_level("WARNING", logger="fed_ros.core.rounds.store"):
        snap = store.load_latest()
    assert snap.round_idx == 0
    assert snap.skipped and snap.skipped[0][0] == 1 and "checksum" in snap.skipped[0][1]
    assert "checksum mismatch" in caplog.text
    with pytest.raises(ValueError, match="checksum"):
        store.load_round(1)


def test_corrupt_manifest_and_missing_file_fall_back(tmp_path):
    store = ModelStore(tmp_path)
    _commit(store, 0)
    _commit(store, 1)
    _commit(store, 2)
    (tmp_path / "round_00000002" / "MANIFEST.json").write_text("{not json")
    (tmp_path / "round_00000001" / "meta.json").unlink()
    snap = store.load_latest()
    assert snap.round_idx == 0 and [r for r, _ in snap.skipped] == [2, 1]


def test_bad_input_writes_nothing(tmp_path):
    store = ModelStore(tmp_path)
    bad = _models(0.0)
    bad[1]["head.b"][0] = np.nan
    with pytest.raises(ValueError, match="cluster 1.*head.b"):
        store.commit(0, bad, _assign(), None, {})
    with pytest.raises(ValueError, match="weight"):
        store.commit(0, _models(0.0), {"robot_0": [(0, -1.0)]}, None, {})
    with pytest.raises(ValueError, match="JSON"):
        store.commit(0, _models(0.0), _assign(), None, {"x": object()})
    with pytest.raises(ValueError, match="dtype"):
        store.commit(0, _models(0.0), _assign(), ({"a": np.array(["s"], dtype=object)}, {}), {})
    with pytest.raises(ValueError, match="round_idx"):
        store.commit(-1, _models(0.0), _assign(), None, {})
    assert list(tmp_path.iterdir()) == []


def test_no_pickle_in_store_files(tmp_path):
    store = ModelStore(tmp_path)
    _commit(store, 0)
    man = json.loads((tmp_path / "round_00000000" / "MANIFEST.json").read_text())
    for name in man["files"]:
        if name.endswith(".npy"):
            np.load(tmp_path / "round_00000000" / name, allow_pickle=False)
    assert os.path.exists(tmp_path / "round_00000000" / "meta.json")
