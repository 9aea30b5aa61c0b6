"""ModelStore, exactly: on-disk layout, write order and fsyncs, failure injection, refusal of
corrupt/truncated/forged files with the file named, validation messages, pruning, round trips.

ROS-free, no torch; every test works in its own tmp_path.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from fed_ros.core.rounds.store import (
    FORMAT_VERSION,
    MANIFEST_NAME,
    META_NAME,
    ModelStore,
    StoreSnapshot,
)


def _sd(value: float) -> dict[str, np.ndarray]:
    return {
        "enc.w": (np.arange(6, dtype=np.float32).reshape(2, 3) + value),
        "head.b": np.array([value, -value], dtype=np.float32),
    }


def _models(value: float = 1.0) -> dict[int, dict[str, np.ndarray]]:
    return {0: _sd(value), 3: _sd(value + 10.0)}


ASSIGN = {"robot_a": [(0, 1.0)], "robot_b": [(0, 0.25), (3, 0.75)]}


def _rdir(root: Path, r: int) -> Path:
    return root / f"round_{r:08d}"


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _forge(rdir: Path, name: str, data: bytes) -> None:
    """Rewrite `name` and fix its checksum in the manifest: what a buggy or hostile writer
    leaves."""
    (rdir / name).write_bytes(data)
    man = json.loads((rdir / MANIFEST_NAME).read_bytes())
    man["files"][name] = hashlib.sha256(data).hexdigest()
    (rdir / MANIFEST_NAME).write_text(json.dumps(man))


def _edit_manifest(rdir: Path, **changes) -> None:
    man = json.loads((rdir / MANIFEST_NAME).read_bytes())
    man.update(changes)
    (rdir / MANIFEST_NAME).write_text(json.dumps(man))


def _assert_models_equal(got, expected) -> None:
    assert sorted(got) == sorted(expected)
    for c in expected:
        assert list(got[c]) == list(expected[c])  # tensor order kept
        for k in expected[c]:
            assert got[c][k].dtype == np.float32 and got[c][k].shape == expected[c][k].shape
            np.testing.assert_array_equal(got[c][k], expected[c][k])


# ------------------------------------------------------------------------------ layout


def test_commit_writes_the_documented_layout_with_exact_manifest_and_meta(tmp_path):
    store = ModelStore(tmp_path)
    arrays = {
        "theta0": np.arange(4, dtype=np.float32),
        "counts": np.array([[1, 2], [3, 4]], dtype=np.int64),
    }
    rdir = store.commit(
        12, _models(), ASSIGN, (arrays, {"name": "fedavg", "k": 2}), {"note": "r12"}
    )
    assert rdir == _rdir(tmp_path, 12)
    assert sorted(p.name for p in rdir.iterdir()) == [
        "MANIFEST.json",
        "cluster_0.npy",
        "cluster_3.npy",
        "meta.json",
        "state_0.npy",
        "state_1.npy",
    ]
    man = json.loads((rdir / MANIFEST_NAME).read_bytes())
    assert man == {
        "format": FORMAT_VERSION,
        "round": 12,
        "files": {
            n: _sha(rdir / n)
            for n in ("cluster_0.npy", "cluster_3.npy", "state_0.npy", "state_1.npy", "meta.json")
        },
    }
    assert FORMAT_VERSION == 1
    meta = json.loads((rdir / META_NAME).read_bytes())
    spec = [
        {"name": "enc.w", "shape": [2, 3], "dtype": "float32"},
        {"name": "head.b", "shape": [2], "dtype": "float32"},
    ]
    assert meta == {
        "round": 12,
        "manifests": {"0": spec, "3": spec},
        "assignments": {"robot_a": [[0, 1.0]], "robot_b": [[0, 0.25], [3, 0.75]]},
        "state_names": ["theta0", "counts"],
        "strategy_meta": {"name": "fedavg", "k": 2},
        "meta": {"note": "r12"},
    }
    # A cluster file is the flat float32 model (tensors concatenated in state-dict order), no
    # pickle.
    flat = np.load(rdir / "cluster_3.npy", allow_pickle=False)
    assert flat.dtype == np.float32 and flat.shape == (8,)
    np.testing.assert_array_equal(
        flat, np.concatenate([_sd(11.0)["enc.w"].ravel(), _sd(11.0)["head.b"]])
    )
    np.testing.assert_array_equal(
        np.load(rdir / "state_1.npy", allow_pickle=False), arrays["counts"]
    )
    assert not any(p.name.endswith(".tmp") for p in rdir.iterdir())


def test_store_directory_is_created_with_parents_and_empty_store_loads_none(tmp_path):
    store = ModelStore(tmp_path / "a" / "b")
    assert (tmp_path / "a" / "b").is_dir()
    assert store.load_latest() is None and store.committed_rounds() == []


@pytest.mark.parametrize("keep", [0, -1])
def test_keep_below_one_is_refused(tmp_path, keep):
    with pytest.raises(ValueError, match=rf"^keep must be >= 1, got {keep}$"):
        ModelStore(tmp_path, keep=keep)


def test_meta_json_is_byte_identical_whatever_the_dict_order(tmp_path):
    a, b = ModelStore(tmp_path / "a"), ModelStore(tmp_path / "b")
    a.commit(
        0,
        {0: _sd(1.0)},
        {"r1": [(0, 1.0)], "r2": [(0, 1.0)]},
        ({}, {"x": 1, "y": 2}),
        {"p": 1, "q": 2},
    )
    b.commit(
        0,
        {0: _sd(1.0)},
        {"r2": [(0, 1.0)], "r1": [(0, 1.0)]},
        ({}, {"y": 2, "x": 1}),
        {"q": 2, "p": 1},
    )
    for name in (META_NAME, MANIFEST_NAME):
        assert (_rdir(tmp_path / "a", 0) / name).read_bytes() == (
            _rdir(tmp_path / "b", 0) / name
        ).read_bytes()


# ------------------------------------------------------------------- write order, durability


class _Recorder:
    """Records fsync targets, renames and crash points in the order they happen."""

    def __init__(self, monkeypatch, root: Path) -> None:
        self.events: list[tuple[str, str]] = []
        self.root = root
        real_fsync, real_replace = os.fsync, os.replace

        def fsync(fd):
            self.events.append(("fsync", self._rel(os.readlink(f"/proc/self/fd/{fd}"))))
            return real_fsync(fd)

        def replace(src, dst):
            self.events.append(("replace", f"{self._rel(src)} -> {self._rel(dst)}"))
            return real_replace(src, dst)

        monkeypatch.setattr(os, "fsync", fsync)
        monkeypatch.setattr(os, "replace", replace)

    def _rel(self, p) -> str:
        return os.path.relpath(os.fspath(p), self.root)

    def crash_point(self, step: str) -> None:
        self.events.append(("step", step))


def _expected_file_events(rdir: str, name: str, step: str) -> list[tuple[str, str]]:
    return [
        ("fsync", f"{rdir}/.{name}.tmp"),
        ("step", f"written:{step}"),
        ("replace", f"{rdir}/.{name}.tmp -> {rdir}/{name}"),
        ("step", f"renamed:{step}"),
        ("fsync", rdir),
        ("step", f"synced:{step}"),
    ]


def test_every_file_is_fsynced_renamed_and_dir_synced_with_the_manifest_last(tmp_path, monkeypatch):
    rec = _Recorder(monkeypatch, tmp_path)
    store = ModelStore(tmp_path, _crash_point=rec.crash_point)
    store.commit(7, {0: _sd(1.0), 2: _sd(2.0)}, {}, ({"a": np.zeros(2)}, {}), {})
    r = "round_00000007"
    expected = [("fsync", "."), ("step", "begin")]
    for name in ("cluster_0.npy", "cluster_2.npy", "state_0.npy", "meta.json"):
        expected += _expected_file_events(r, name, name)
    expected += _expected_file_events(r, MANIFEST_NAME, "manifest") + [("step", "committed")]
    assert rec.events == expected


def test_recommitting_a_round_uncommits_it_durably_before_writing(tmp_path, monkeypatch):
    store = ModelStore(tmp_path)
    store.commit(0, {0: _sd(0.0)}, {}, None, {})
    store.commit(1, {0: _sd(1.0)}, {}, None, {})
    rec = _Recorder(monkeypatch, tmp_path)
    seen_at_begin = []

    def crash_point(step):
        rec.crash_point(step)
        if step == "begin":
            seen_at_begin.append((_rdir(tmp_path, 1) / MANIFEST_NAME).exists())

    ModelStore(tmp_path, _crash_point=crash_point).commit(1, {0: _sd(5.0)}, {}, None, {})
    assert seen_at_begin == [False]
    assert rec.events[:3] == [("fsync", "."), ("fsync", "round_00000001"), ("step", "begin")]
    _assert_models_equal(ModelStore(tmp_path).load_latest().cluster_models, {0: _sd(5.0)})


class _Crash(BaseException):
    """The process dying at that point (BaseException: nothing in the store may catch it)."""


def test_crash_right_after_uncommitting_a_recommit_falls_back_to_the_round_before(tmp_path):
    ModelStore(tmp_path).commit(0, {0: _sd(0.0)}, {}, None, {"r": 0})
    ModelStore(tmp_path).commit(1, {0: _sd(1.0)}, {}, None, {"r": 1})

    def die(step):
        if step == "begin":
            raise _Crash(step)

    with pytest.raises(_Crash):
        ModelStore(tmp_path, _crash_point=die).commit(1, {0: _sd(9.0)}, {}, None, {"r": 9})
    snap = ModelStore(tmp_path).load_latest()
    assert snap.round_idx == 0 and snap.meta == {"r": 0}
    assert snap.skipped == [(1, "not committed (no MANIFEST.json)")]
    _assert_models_equal(snap.cluster_models, {0: _sd(0.0)})


@pytest.mark.parametrize("target", ["cluster_0.npy", "state_0.npy", "meta.json", "MANIFEST.json"])
def test_failed_rename_leaves_the_last_good_round_and_the_next_commit_wins(
    tmp_path, monkeypatch, target
):
    store = ModelStore(tmp_path)
    store.commit(0, {0: _sd(0.0)}, {"r": [(0, 1.0)]}, ({"s": np.ones(2)}, {}), {"round": 0})
    real_replace = os.replace

    def failing_replace(src, dst):
        if Path(dst).name == target:
            raise OSError(28, "No space left on device")
        return real_replace(src, dst)

    monkeypatch.setattr(os, "replace", failing_replace)
    with pytest.raises(OSError, match="No space left"):
        store.commit(
            1, {0: _sd(1.0)}, {"r": [(0, 1.0)]}, ({"s": np.full(2, 2.0)}, {}), {"round": 1}
        )
    monkeypatch.setattr(os, "replace", real_replace)
    assert store.committed_rounds() == [0]
    snap = store.load_latest()
    assert snap.round_idx == 0 and snap.meta == {"round": 0} and snap.skipped[0][0] == 1
    _assert_models_equal(snap.cluster_models, {0: _sd(0.0)})
    np.testing.assert_array_equal(snap.strategy_arrays["s"], np.ones(2))
    store.commit(2, {0: _sd(2.0)}, {"r": [(0, 1.0)]}, None, {"round": 2})
    assert store.load_latest().round_idx == 2
    # The half-written round 1 (older than the newest commit) was a crash leftover: pruned.
    assert sorted(p.name for p in tmp_path.iterdir()) == ["round_00000000", "round_00000002"]


def test_write_error_mid_file_never_replaces_the_good_file(tmp_path, monkeypatch):
    store = ModelStore(tmp_path)
    store.commit(0, {0: _sd(0.0)}, {}, None, {})
    good = (_rdir(tmp_path, 0) / "cluster_0.npy").read_bytes()
    real_fsync = os.fsync

    def failing_fsync(fd):
        if os.readlink(f"/proc/self/fd/{fd}").endswith(".cluster_0.npy.tmp"):
            raise OSError(5, "Input/output error")
        return real_fsync(fd)

    monkeypatch.setattr(os, "fsync", failing_fsync)
    with pytest.raises(OSError, match="Input/output"):
        store.commit(0, {0: _sd(7.0)}, {}, None, {})  # re-commit of round 0 fails
    monkeypatch.setattr(os, "fsync", real_fsync)
    # The good bytes were never overwritten in place; the round is un-committed, so not used.
    assert (_rdir(tmp_path, 0) / "cluster_0.npy").read_bytes() == good
    assert store.load_latest() is None
    store.commit(0, {0: _sd(7.0)}, {}, None, {})
    _assert_models_equal(store.load_latest().cluster_models, {0: _sd(7.0)})
    assert not any(p.name.endswith(".tmp") for p in tmp_path.rglob("*"))


# ------------------------------------------------------------------ refusing bad files


@pytest.fixture
def two_rounds(tmp_path):
    store = ModelStore(tmp_path)
    store.commit(
        0, {0: _sd(0.0)}, {"r": [(0, 1.0)]}, ({"s": np.arange(3.0)}, {"v": 0}), {"round": 0}
    )
    store.commit(
        1, {0: _sd(1.0)}, {"r": [(0, 1.0)]}, ({"s": np.arange(3.0) + 1}, {"v": 1}), {"round": 1}
    )
    return store, _rdir(tmp_path, 1)


def _refused(store: ModelStore, message: str, caplog) -> None:
    """Round 1 is refused with `message` (exactly) and load_latest falls back to round 0."""
    with pytest.raises(ValueError) as exc:
        store.load_round(1)
    assert str(exc.value) == message
    with caplog.at_level(logging.WARNING, logger="fed_ros.core.rounds.store"):
        snap = store.load_latest()
    assert snap.round_idx == 0 and snap.meta == {"round": 0} and snap.strategy_meta == {"v": 0}
    _assert_models_equal(snap.cluster_models, {0: _sd(0.0)})
    assert snap.skipped == [(1, message)]
    assert [r.getMessage() for r in caplog.records if r.name == "fed_ros.core.rounds.store"] == [
        f"model store: skipping round 1: {message}"
    ]


def test_truncated_cluster_file_is_refused_naming_it(two_rounds, caplog):
    store, rdir = two_rounds
    path = rdir / "cluster_0.npy"
    path.write_bytes(path.read_bytes()[:-5])
    _refused(store, "checksum mismatch for 'cluster_0.npy'", caplog)


def test_flipped_bit_in_meta_is_refused_naming_it(two_rounds, caplog):
    store, rdir = two_rounds
    raw = bytearray((rdir / META_NAME).read_bytes())
    raw[5] ^= 0x01
    (rdir / META_NAME).write_bytes(bytes(raw))
    _refused(store, "checksum mismatch for 'meta.json'", caplog)


def test_missing_listed_file_is_refused_naming_it(two_rounds, caplog):
    store, rdir = two_rounds
    (rdir / "state_0.npy").unlink()
    _refused(store, "file 'state_0.npy' listed in manifest is missing", caplog)


def test_listed_name_that_is_a_directory_is_refused(two_rounds, caplog):
    store, rdir = two_rounds
    (rdir / "state_0.npy").unlink()
    (rdir / "state_0.npy").mkdir()
    _refused(store, "file 'state_0.npy' listed in manifest is missing", caplog)


@pytest.mark.parametrize("name", ["sub/x.npy", ".meta.json.tmp"])
def test_manifest_naming_a_path_outside_the_round_or_a_temp_file_is_refused(
    two_rounds, caplog, name
):
    store, rdir = two_rounds
    (rdir / "sub").mkdir()
    (rdir / name).write_bytes(b"data")  # exists, with the right checksum: still refused
    man = json.loads((rdir / MANIFEST_NAME).read_bytes())
    man["files"][name] = hashlib.sha256(b"data").hexdigest()
    (rdir / MANIFEST_NAME).write_text(json.dumps(man))
    _refused(store, f"file {name!r} listed in manifest is missing", caplog)


@pytest.mark.parametrize(
    "text",
    [
        "{not json",
        "",
        "[1, 2]",
        '{"round": 1, "format": 1}',
        '{"files": {}, "format": 1}',
        '{"files": {}, "round": 1}',
        '{"files": 3, "round": 1, "format": 1}',
        '{"files": {}, "round": null, "format": 1}',
        b"\xff\xfe",
    ],
)
def test_corrupt_manifest_is_refused(two_rounds, caplog, text):
    store, rdir = two_rounds
    (rdir / MANIFEST_NAME).write_bytes(text if isinstance(text, bytes) else text.encode())
    with pytest.raises(ValueError, match=r"^corrupt MANIFEST\.json \(") as exc:
        store.load_round(1)
    _refused(store, str(exc.value), caplog)


@pytest.mark.parametrize(
    "changes,message",
    [
        ({"round": 0}, "manifest round/format 0/1 mismatch"),
        ({"round": 2}, "manifest round/format 2/1 mismatch"),
        ({"format": 2}, "manifest round/format 1/2 mismatch"),
        ({"format": 0}, "manifest round/format 1/0 mismatch"),
    ],
)
def test_manifest_of_another_round_or_format_is_refused(two_rounds, caplog, changes, message):
    store, rdir = two_rounds
    _edit_manifest(rdir, **changes)
    _refused(store, message, caplog)


def test_manifest_without_meta_is_refused(two_rounds, caplog):
    store, rdir = two_rounds
    man = json.loads((rdir / MANIFEST_NAME).read_bytes())
    del man["files"][META_NAME]
    _edit_manifest(rdir, files=man["files"])
    _refused(store, "manifest does not list meta.json", caplog)


@pytest.mark.parametrize("name", ["cluster_0.npy", "state_0.npy"])
def test_manifest_without_a_model_or_state_file_is_refused(two_rounds, caplog, name):
    store, rdir = two_rounds
    man = json.loads((rdir / MANIFEST_NAME).read_bytes())
    del man["files"][name]
    _edit_manifest(rdir, files=man["files"])
    _refused(store, f"manifest does not list {name}", caplog)


@pytest.mark.parametrize(
    "meta",
    [
        b"{oops",
        b"[]",
        b'{"manifests": {}, "state_names": []}',
        b'{"manifests": {"x": []}, "state_names": [], "assignments": {}}',
        b'{"manifests": {"0": [{"name": "w"}]}, "state_names": [], "assignments": {}}',
        b'{"manifests": {}, "state_names": [], "assignments": {"r": [[0]]}}',
        b'{"manifests": {}, "assignments": {}}',
    ],
)
def test_forged_meta_with_a_valid_checksum_is_refused(two_rounds, caplog, meta):
    store, rdir = two_rounds
    _forge(rdir, META_NAME, meta)
    with pytest.raises(ValueError, match=r"^corrupt meta\.json \(") as exc:
        store.load_round(1)
    _refused(store, str(exc.value), caplog)


def _npy_bytes(arr: np.ndarray) -> bytes:
    import io

    buf = io.BytesIO()
    np.save(buf, arr, allow_pickle=False)
    return buf.getvalue()


@pytest.mark.parametrize(
    "arr,desc",
    [
        (np.zeros(7, np.float32), "(7,) dtype float32"),
        (np.zeros(8, np.float64), "(8,) dtype float64"),
        (np.zeros((2, 4), np.float32), "(2, 4) dtype float32"),
    ],
)
def test_cluster_file_of_the_wrong_shape_or_dtype_is_refused(two_rounds, caplog, arr, desc):
    store, rdir = two_rounds
    _forge(rdir, "cluster_0.npy", _npy_bytes(arr))
    _refused(store, f"cluster_0.npy has shape {desc}, manifest says (8,) float32", caplog)


@pytest.mark.parametrize("name", ["cluster_0.npy", "state_0.npy"])
def test_unreadable_array_with_a_valid_checksum_is_refused(two_rounds, caplog, name):
    store, rdir = two_rounds
    _forge(rdir, name, _npy_bytes(np.zeros(8, np.float32))[:-4])  # header promises more bytes
    with pytest.raises(ValueError, match=rf"^unreadable array {name} \(") as exc:
        store.load_round(1)
    _refused(store, str(exc.value), caplog)


def test_pickled_array_is_refused(two_rounds, caplog):
    store, rdir = two_rounds
    import io

    buf = io.BytesIO()
    np.save(buf, np.array([{"evil": 1}], dtype=object), allow_pickle=True)
    _forge(rdir, "state_0.npy", buf.getvalue())
    with pytest.raises(ValueError, match=r"^unreadable array state_0\.npy \(.*allow_pickle") as exc:
        store.load_round(1)
    _refused(store, str(exc.value), caplog)


def test_uncommitted_newer_round_is_skipped_with_its_reason(two_rounds):
    store, rdir = two_rounds
    _rdir(store.directory, 5).mkdir()
    snap = store.load_latest()
    assert snap.round_idx == 1
    assert snap.skipped == [(5, "not committed (no MANIFEST.json)")]
    with pytest.raises(ValueError, match=r"^not committed \(no MANIFEST\.json\)$"):
        store.load_round(5)
    with pytest.raises(ValueError, match="not committed"):
        store.load_round(99)


def test_every_round_bad_gives_none(two_rounds):
    store, rdir = two_rounds
    for r in (0, 1):
        (_rdir(store.directory, r) / META_NAME).write_bytes(b"x")
    assert store.load_latest() is None


def test_skipped_lists_every_newer_bad_round_newest_first(tmp_path):
    store = ModelStore(tmp_path, keep=5)
    for r in range(4):
        store.commit(r, {0: _sd(float(r))}, {}, None, {"r": r})
    (_rdir(tmp_path, 3) / "cluster_0.npy").write_bytes(b"")
    (_rdir(tmp_path, 2) / MANIFEST_NAME).unlink()
    snap = store.load_latest()
    assert snap.round_idx == 1 and snap.meta == {"r": 1}
    assert snap.skipped == [
        (3, "checksum mismatch for 'cluster_0.npy'"),
        (2, "not committed (no MANIFEST.json)"),
    ]
    assert store.load_round(0).skipped == []


# --------------------------------------------------------------------------- validation


def _assert_nothing_written(root: Path, before: dict[str, bytes]) -> None:
    now = {str(p.relative_to(root)): p.read_bytes() for p in root.rglob("*") if p.is_file()}
    assert now == before
    assert sorted(p.name for p in root.iterdir()) == sorted({Path(k).parts[0] for k in before})


@pytest.fixture
def one_round(tmp_path):
    store = ModelStore(tmp_path)
    store.commit(0, {0: _sd(0.0)}, {}, None, {})
    before = {
        str(p.relative_to(tmp_path)): p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()
    }
    return store, before


@pytest.mark.parametrize("round_idx", [-1, True, False, 1.0, "3", None])
def test_bad_round_index_is_refused_before_any_write(one_round, round_idx):
    store, before = one_round
    with pytest.raises(
        ValueError, match=rf"^round_idx must be an int >= 0, got {round_idx!r}$".replace("(", r"\(")
    ):
        store.commit(round_idx, {0: _sd(1.0)}, {}, None, {})
    _assert_nothing_written(store.directory, before)


def test_numpy_integer_round_and_cluster_ids_are_accepted(tmp_path):
    store = ModelStore(tmp_path)
    rdir = store.commit(
        np.int64(4), {np.int32(2): _sd(2.0)}, {"r": [(np.int64(2), np.float32(0.5))]}, None, {}
    )
    assert rdir.name == "round_00000004"
    snap = store.load_round(4)
    assert snap.round_idx == 4 and type(snap.round_idx) is int
    assert list(snap.cluster_models) == [2] and type(next(iter(snap.cluster_models))) is int
    assert snap.assignments == {"r": [(2, 0.5)]}
    c, w = snap.assignments["r"][0]
    assert type(c) is int and type(w) is float


@pytest.mark.parametrize(
    "models,message",
    [
        ([_sd(1.0)], "cluster_models must be a mapping, got list"),
        ({"0": _sd(1.0)}, "cluster id '0' is not an int"),
        ({True: _sd(1.0)}, "cluster id True is not an int"),
        ({1.0: _sd(1.0)}, "cluster id 1.0 is not an int"),
        (
            {0: _sd(1.0), 1: {"w": np.zeros(2, np.float64)}},
            "cluster 1: tensor 'w': dtype 'float64' not in ('float32',)",
        ),
        (
            {0: {"w": np.array([1.0, np.inf], np.float32)}},
            "cluster 0: tensor 'w' has 1 non-finite values (NaN/Inf)",
        ),
        ({0: {"w": [1.0]}}, "cluster 0: tensor 'w' is list, expected numpy.ndarray"),
    ],
)
def test_bad_cluster_models_are_refused_naming_the_cluster(one_round, models, message):
    store, before = one_round
    with pytest.raises(ValueError) as exc:
        store.commit(1, models, {}, None, {})
    assert str(exc.value) == message
    _assert_nothing_written(store.directory, before)


@pytest.mark.parametrize(
    "assign,message",
    [
        ({3: [(0, 1.0)]}, "assignment key 3 is not a robot id string"),
        ({"r": [(0,)]}, "assignment of 'r' has malformed entry (0,)"),
        ({"r": [(0, 1.0, 2)]}, "assignment of 'r' has malformed entry (0, 1.0, 2)"),
        ({"r": [("a", 1.0)]}, "assignment of 'r' has malformed entry ('a', 1.0)"),
        ({"r": [(0, None)]}, "assignment of 'r' has malformed entry (0, None)"),
        ({"r": [None]}, "assignment of 'r' has malformed entry None"),
        ({"r": [(0, -0.5)]}, "assignment of 'r': weight -0.5 must be finite and >= 0"),
        ({"r": [(0, float("nan"))]}, "assignment of 'r': weight nan must be finite and >= 0"),
        ({"r": [(0, float("inf"))]}, "assignment of 'r': weight inf must be finite and >= 0"),
    ],
)
def test_bad_assignments_are_refused_naming_robot_and_entry(one_round, assign, message):
    store, before = one_round
    with pytest.raises(ValueError) as exc:
        store.commit(1, {0: _sd(1.0)}, assign, None, {})
    assert str(exc.value) == message
    _assert_nothing_written(store.directory, before)


def test_zero_weight_membership_entries_are_kept(tmp_path):
    # IFCA lists every cluster with weight 0.0 except the robot's choice.
    store = ModelStore(tmp_path)
    store.commit(0, {0: _sd(0.0), 1: _sd(1.0)}, {"r": [(0, 0.0), (1, 1.0)], "idle": []}, None, {})
    assert store.load_latest().assignments == {"r": [(0, 0.0), (1, 1.0)], "idle": []}


@pytest.mark.parametrize(
    "arrays,message",
    [
        ({1: np.zeros(2)}, "strategy array key 1 is not a string"),
        ({"c": np.zeros(2, np.complex64)}, "strategy array 'c' has unsupported dtype complex64"),
        ({"s": np.array(["a"])}, "strategy array 's' has unsupported dtype <U1"),
        (
            {"o": np.array([1, None], dtype=object)},
            "strategy array 'o' has unsupported dtype object",
        ),
        (
            {"t": np.zeros(1, dtype="M8[s]")},
            "strategy array 't' has unsupported dtype datetime64[s]",
        ),
        (
            {"v": np.array([(1, 2.0)], dtype=[("a", "i4"), ("b", "f8")])},
            "strategy array 'v' has unsupported dtype [('a', '<i4'), ('b', '<f8')]",
        ),
        ({"n": np.array([0.0, np.nan])}, "strategy array 'n' holds NaN/Inf values"),
        ({"i": np.array([np.inf], np.float16)}, "strategy array 'i' holds NaN/Inf values"),
    ],
)
def test_bad_strategy_arrays_are_refused_naming_the_key(one_round, arrays, message):
    store, before = one_round
    with pytest.raises(ValueError) as exc:
        store.commit(1, {0: _sd(1.0)}, {}, (arrays, {}), {})
    assert str(exc.value) == message
    _assert_nothing_written(store.directory, before)


@pytest.mark.parametrize(
    "smeta,meta",
    [
        ({"x": object()}, {}),
        ({}, {"x": object()}),
        ({}, {"x": float("nan")}),
        ({"x": np.float32("inf")}, {}),
        ({}, {1: "a", "b": 2}),
        ({}, {"s": {1, 2}}),
    ],
)
def test_meta_that_is_not_plain_json_is_refused(one_round, smeta, meta):
    store, before = one_round
    with pytest.raises(
        ValueError,
        match=r"^store meta / strategy meta is not plain JSON \(finite numbers, str, "
        r"list, dict\): ",
    ):
        store.commit(1, {0: _sd(1.0)}, {}, ({}, smeta), meta)
    _assert_nothing_written(store.directory, before)


def test_object_in_meta_is_named_in_the_error(one_round):
    store, _ = one_round
    with pytest.raises(ValueError, match="set is not JSON serialisable"):
        store.commit(1, {0: _sd(1.0)}, {}, None, {"s": {1, 2}})


# --------------------------------------------------------------------------- round trip


def test_numpy_values_in_meta_become_plain_json(tmp_path):
    store = ModelStore(tmp_path)
    meta = {
        "i": np.int64(3),
        "f": np.float32(0.5),
        "a": np.arange(3),
        "t": (1, 2),
        "nested": {"u": np.uint8(7)},
    }
    store.commit(0, {0: _sd(0.0)}, {}, ({}, {"arr": np.array([[1.5]])}), meta)
    snap = store.load_latest()
    assert snap.meta == {"i": 3, "f": 0.5, "a": [0, 1, 2], "t": [1, 2], "nested": {"u": 7}}
    assert type(snap.meta["i"]) is int and type(snap.meta["f"]) is float
    assert snap.strategy_meta == {"arr": [[1.5]]}


def test_strategy_arrays_round_trip_with_dtype_shape_and_order(tmp_path):
    arrays = {
        "theta0": np.linspace(-1, 1, 5, dtype=np.float32),
        "f64": np.array([[1.0, 2.5], [3.0, -4.0], [5.0, 6.0]]),
        "fortran": np.asfortranarray(np.arange(6, dtype=np.int32).reshape(2, 3)),
        "big_endian": np.array([1, 258, -3], dtype=">i4"),
        "big_float": np.array([1.5, -2.25], dtype=">f8"),
        "flags": np.array([True, False, True]),
        "u16": np.array([0, 65535], dtype=np.uint16),
        "i8": np.array([-128, 127], dtype=np.int8),
        "empty": np.zeros((0, 3), dtype=np.float32),
        "scalar": np.array(2.5),
        "int_scalar": np.array(7, dtype=np.int64),
        "half": np.array([0.5, 1.0], dtype=np.float16),
        "from_list": [1, 2, 3],
    }
    store = ModelStore(tmp_path)
    store.commit(0, {0: _sd(0.0)}, {}, (arrays, {"name": "x"}), {})
    snap = store.load_latest()
    got, meta = snap.strategy_state
    assert meta == {"name": "x"} and list(got) == list(arrays)
    for key, want in arrays.items():
        want = np.asarray(want)
        assert got[key].shape == want.shape, key
        assert got[key].dtype == want.dtype.newbyteorder("="), key  # values kept, native order
        assert got[key].dtype.isnative, key
        np.testing.assert_array_equal(got[key], want)


@settings(
    max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    arr=hnp.arrays(
        dtype=st.sampled_from([np.float32, np.float64, np.int16, np.int64, np.uint8, np.bool_]),
        shape=hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=4),
        elements={"allow_nan": False, "allow_infinity": False},
    ),
    value=st.floats(-1e6, 1e6, width=32),
)
def test_any_finite_state_and_model_round_trip_exactly(tmp_path_factory, arr, value):
    store = ModelStore(tmp_path_factory.mktemp("prop"))
    models = {5: {"w": np.full((3, 2), value, np.float32), "b": np.array([value], np.float32)}}
    store.commit(3, models, {"r": [(5, 1.0)]}, ({"x": arr}, {}), {})
    snap = store.load_latest()
    _assert_models_equal(snap.cluster_models, models)
    assert (
        snap.strategy_arrays["x"].shape == arr.shape
        and snap.strategy_arrays["x"].dtype == arr.dtype
    )
    np.testing.assert_array_equal(snap.strategy_arrays["x"], arr)


def test_no_strategy_state_and_no_meta_load_as_empty(tmp_path):
    store = ModelStore(tmp_path)
    store.commit(0, {}, {}, None, None)
    snap = store.load_latest()
    assert isinstance(snap, StoreSnapshot)
    assert (
        snap.round_idx,
        snap.cluster_models,
        snap.assignments,
        snap.strategy_arrays,
        snap.strategy_meta,
        snap.meta,
        snap.skipped,
    ) == (0, {}, {}, {}, {}, {}, [])
    assert snap.strategy_state == ({}, {})
    assert sorted(p.name for p in _rdir(tmp_path, 0).iterdir()) == [MANIFEST_NAME, META_NAME]


def test_committing_does_not_modify_the_callers_arrays(tmp_path):
    models = {0: _sd(3.0)}
    arrays = {"be": np.array([1, 2], dtype=">i4")}
    copies = ({k: v.copy() for k, v in models[0].items()}, arrays["be"].copy())
    ModelStore(tmp_path).commit(0, models, {}, (arrays, {}), {})
    for k, v in copies[0].items():
        np.testing.assert_array_equal(models[0][k], v)
    assert arrays["be"].dtype == np.dtype(">i4") and arrays["be"].tolist() == [1, 2]


# ------------------------------------------------------------------------------- pruning


def test_keep_retains_exactly_the_newest_rounds(tmp_path):
    store = ModelStore(tmp_path, keep=2)
    for r in range(5):
        store.commit(r, {0: _sd(float(r))}, {}, None, {})
        assert store.committed_rounds() == list(range(max(0, r - 1), r + 1))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["round_00000003", "round_00000004"]


def test_keep_one_keeps_only_the_newest(tmp_path):
    store = ModelStore(tmp_path, keep=1)
    for r in (0, 1, 2):
        store.commit(r, {0: _sd(float(r))}, {}, None, {})
    assert sorted(p.name for p in tmp_path.iterdir()) == ["round_00000002"]
    assert store.load_latest().round_idx == 2


def test_prune_removes_older_crash_leftovers_but_not_newer_dirs_or_foreign_entries(tmp_path):
    store = ModelStore(tmp_path, keep=3)
    store.commit(1, {0: _sd(1.0)}, {}, None, {})
    (_rdir(tmp_path, 0)).mkdir()  # leftover of a commit that died
    (_rdir(tmp_path, 0) / ".cluster_0.npy.tmp").write_bytes(b"partial")
    (_rdir(tmp_path, 9)).mkdir()  # newer, uncommitted: not ours to judge
    (tmp_path / "round_00000004").write_bytes(b"a file, not a round")
    (tmp_path / "round_5").mkdir()
    (tmp_path / "notes.txt").write_text("keep me")
    store.commit(2, {0: _sd(2.0)}, {}, None, {})
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "notes.txt",
        "round_00000001",
        "round_00000002",
        "round_00000004",
        "round_00000009",
        "round_5",
    ]
    assert store.committed_rounds() == [1, 2]
    snap = store.load_latest()
    assert snap.round_idx == 2 and snap.skipped == [(9, "not committed (no MANIFEST.json)")]


def test_committed_rounds_counts_manifests_oldest_first(tmp_path):
    store = ModelStore(tmp_path, keep=10)
    for r in (3, 1, 2):
        store.commit(r, {0: _sd(float(r))}, {}, None, {})
    (_rdir(tmp_path, 7)).mkdir()
    assert store.committed_rounds() == [1, 2, 3]


def test_default_keeps_three_rounds(tmp_path):
    store = ModelStore(tmp_path)
    for r in range(5):
        store.commit(r, {0: _sd(float(r))}, {}, None, {})
    assert store.keep == 3 and store.committed_rounds() == [2, 3, 4]


def test_failed_prune_does_not_fail_a_durable_commit_and_is_retried(tmp_path, monkeypatch):
    store = ModelStore(tmp_path, keep=1)
    store.commit(0, {0: _sd(0.0)}, {}, None, {})
    real_rmdir = os.rmdir

    def stuck_rmdir(path, *args, **kwargs):
        raise PermissionError(13, "Permission denied", os.fspath(path))

    monkeypatch.setattr(os, "rmdir", stuck_rmdir)
    store.commit(1, {0: _sd(1.0)}, {}, None, {})  # committed; pruning round 0 failed
    monkeypatch.setattr(os, "rmdir", real_rmdir)
    assert store.load_latest().round_idx == 1 and _rdir(tmp_path, 0).is_dir()
    store.commit(2, {0: _sd(2.0)}, {}, None, {})
    assert sorted(p.name for p in tmp_path.iterdir()) == ["round_00000002"]


def test_failed_removal_of_a_crash_leftover_does_not_fail_the_commit(tmp_path, monkeypatch):
    store = ModelStore(tmp_path, keep=2)
    _rdir(tmp_path, 0).mkdir()  # uncommitted leftover

    def stuck_rmdir(path, *args, **kwargs):
        raise PermissionError(13, "Permission denied", os.fspath(path))

    monkeypatch.setattr(os, "rmdir", stuck_rmdir)
    store.commit(1, {0: _sd(1.0)}, {}, None, {})
    monkeypatch.undo()
    assert store.load_latest().round_idx == 1 and _rdir(tmp_path, 0).is_dir()


def test_meta_without_the_optional_strategy_and_user_meta_loads_them_empty(tmp_path):
    store = ModelStore(tmp_path)
    store.commit(0, {0: _sd(0.0)}, {"r": [(0, 1.0)]}, None, {"x": 1})
    rdir = _rdir(tmp_path, 0)
    meta = json.loads((rdir / META_NAME).read_bytes())
    del meta["strategy_meta"], meta["meta"]
    _forge(rdir, META_NAME, json.dumps(meta).encode())
    snap = store.load_round(0)
    assert (snap.strategy_meta, snap.meta, snap.assignments) == ({}, {}, {"r": [(0, 1.0)]})
    _assert_models_equal(snap.cluster_models, {0: _sd(0.0)})


def test_directory_whose_name_only_starts_like_a_round_is_ignored(tmp_path):
    # "round_00000005\n" matched ^round_(\d{8})$ (a "$" also matches before a trailing
    # newline), counted round 5 twice and made keep=2 prune round 5 as well.
    store = ModelStore(tmp_path, keep=2)
    for r in (4, 5):
        store.commit(r, {0: _sd(float(r))}, {}, None, {})
    (tmp_path / "round_00000005\n").mkdir()
    assert store.committed_rounds() == [4, 5]
    store.commit(6, {0: _sd(6.0)}, {}, None, {})
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "round_00000005",
        "round_00000005\n",
        "round_00000006",
    ]
    assert store.committed_rounds() == [5, 6]
    assert store.load_latest().round_idx == 6
