"""Crash-safe model store: per-round cluster models, assignments and strategy state.

Layout (one directory per committed round)::

    <directory>/round_00000012/cluster_0.npy      flat float32 model of cluster 0
    <directory>/round_00000012/state_0.npy        strategy arrays (names in meta.json)
    <directory>/round_00000012/meta.json          assignments, manifests, strategy meta, user meta
    <directory>/round_00000012/MANIFEST.json      sha256 of every file above; written LAST

Every file is written to a temp name, fsync'ed, renamed into place and the directory
fsync'ed; the round's MANIFEST.json is written the same way after all other files, so a
round exists only once its manifest is durable (the commit point). Loading walks rounds
newest first and returns the first whose manifest parses and whose files all match their
checksums; anything else is skipped with a logged reason, never used. Arrays are ``.npy``
read with ``allow_pickle=False`` (:mod:`fed_ros.core.rounds.npy_files`); metadata is JSON.
No pickle anywhere.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import shutil
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from fed_ros.core.params import (
    StateDict,
    check_finite,
    manifest_from_json,
    manifest_of,
    manifest_to_json,
    num_params,
    unflatten,
)
from fed_ros.core.rounds.npy_files import array_writer, load_npy, tensor_writer

log = logging.getLogger("fed_ros.core.rounds.store")

FORMAT_VERSION = 1
MANIFEST_NAME = "MANIFEST.json"
META_NAME = "meta.json"
_ROUND_RE = re.compile(r"^round_(\d{8})$")


@dataclass
class StoreSnapshot:
    """One committed round as loaded from disk."""

    round_idx: int
    cluster_models: dict[int, StateDict]
    assignments: dict[str, list[tuple[int, float]]]
    strategy_arrays: dict[str, np.ndarray]
    strategy_meta: dict[str, Any]
    meta: dict[str, Any]
    skipped: list[tuple[int, str]] = field(
        default_factory=list
    )  # newer rounds rejected, with reasons

    @property
    def strategy_state(self) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        """(arrays, meta) as `Strategy.load_state` takes them."""
        return self.strategy_arrays, self.strategy_meta


def _fsync_dir(path: Path) -> None:
    fd = os.open(str(path), os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fp:
        for block in iter(lambda: fp.read(1 << 22), b""):
            h.update(block)
    return h.hexdigest()


class _HashingWriter:
    """File wrapper that hashes everything written (so checksums cost no second read)."""

    def __init__(self, fp) -> None:
        self.fp = fp
        self.h = hashlib.sha256()

    def write(self, data) -> int:
        self.h.update(data)
        return self.fp.write(data)


def _json_default(obj: Any) -> Any:
    if isinstance(obj, (np.integer,)):
        return int(obj)
    if isinstance(obj, (np.floating,)):
        return float(obj)
    if isinstance(obj, np.ndarray):
        return obj.tolist()
    if isinstance(obj, tuple):
        return list(obj)
    raise TypeError(f"{type(obj).__name__} is not JSON serialisable")


def _dumps(obj: Any, what: str) -> bytes:
    try:
        return json.dumps(obj, default=_json_default, allow_nan=False, sort_keys=True).encode()
    except (TypeError, ValueError) as exc:
        raise ValueError(
            f"{what} is not plain JSON (finite numbers, str, list, dict): {exc}"
        ) from None


class ModelStore:
    """Atomic, checksummed per-round checkpoint directory (see module docstring).

    `keep` committed rounds are retained (older ones pruned after a successful commit).
    `_crash_point(step)` is called between the steps of a commit; tests use it to stop a
    commit at any step (raise, or `os._exit` for a real kill) and check recovery.
    """

    def __init__(
        self,
        directory: str | os.PathLike,
        keep: int = 3,
        _crash_point: Callable[[str], None] | None = None,
    ) -> None:
        if keep < 1:
            raise ValueError(f"keep must be >= 1, got {keep}")
        self.directory = Path(directory)
        self.keep = int(keep)
        self._crash_point = _crash_point or (lambda step: None)
        self.directory.mkdir(parents=True, exist_ok=True)

    # ----------------------------------------------------------------------------- commit
    def commit(
        self,
        round_idx: int,
        cluster_models: Mapping[int, Mapping[str, np.ndarray]],
        assignments: Mapping[str, list[tuple[int, float]]],
        strategy_state: tuple[Mapping[str, np.ndarray], Mapping[str, Any]] | None = None,
        meta: Mapping[str, Any] | None = None,
    ) -> Path:
        """Persist one round atomically.

        Validates everything first, so nothing is written on error.
        """
        plan = self._validate(round_idx, cluster_models, assignments, strategy_state, meta)
        rdir = self.directory / f"round_{int(round_idx):08d}"
        rdir.mkdir(exist_ok=True)
        _fsync_dir(self.directory)
        manifest_path = rdir / MANIFEST_NAME
        if manifest_path.exists():
            # Re-committing a round: un-commit it first so a crash mid-way falls back to r-1.
            manifest_path.unlink()
            _fsync_dir(rdir)
        self._crash_point("begin")
        checksums: dict[str, str] = {}
        for name, writer in plan["files"]:
            checksums[name] = self._write_atomic(rdir, name, writer)
        man = {"format": FORMAT_VERSION, "round": int(round_idx), "files": checksums}
        self._write_atomic(
            rdir, MANIFEST_NAME, lambda w: w.write(_dumps(man, "manifest")), step="manifest"
        )
        self._crash_point("committed")
        self._prune()
        return rdir

    def _write_atomic(
        self,
        rdir: Path,
        name: str,
        writer: Callable[[_HashingWriter], Any],
        step: str | None = None,
    ) -> str:
        step = step or name
        tmp = rdir / f".{name}.tmp"
        with open(tmp, "wb") as fp:
            hw = _HashingWriter(fp)
            writer(hw)
            fp.flush()
            os.fsync(fp.fileno())
        self._crash_point(f"written:{step}")
        os.replace(tmp, rdir / name)
        self._crash_point(f"renamed:{step}")
        _fsync_dir(rdir)
        self._crash_point(f"synced:{step}")
        return hw.h.hexdigest()

    def _validate(self, round_idx, cluster_models, assignments, strategy_state, meta) -> dict:
        if (
            not isinstance(round_idx, (int, np.integer))
            or isinstance(round_idx, bool)
            or round_idx < 0
        ):
            raise ValueError(f"round_idx must be an int >= 0, got {round_idx!r}")
        if not isinstance(cluster_models, Mapping):
            raise ValueError(
                f"cluster_models must be a mapping, got {type(cluster_models).__name__}"
            )
        files: list[tuple[str, Callable]] = []
        manifests: dict[str, list] = {}
        for cid, sd in cluster_models.items():
            if not isinstance(cid, (int, np.integer)) or isinstance(cid, bool):
                raise ValueError(f"cluster id {cid!r} is not an int")
            try:
                man = manifest_of(sd)
                check_finite(sd)
            except ValueError as exc:
                raise ValueError(f"cluster {cid}: {exc}") from None
            manifests[str(int(cid))] = manifest_to_json(man)
            files.append((f"cluster_{int(cid)}.npy", tensor_writer(sd, num_params(man))))
        clean_assign: dict[str, list[list[float]]] = {}
        for rid, mem in assignments.items():
            if not isinstance(rid, str):
                raise ValueError(f"assignment key {rid!r} is not a robot id string")
            rows = []
            for entry in mem:
                try:
                    cid, w = entry
                    cid_i, w_f = int(cid), float(w)
                except (TypeError, ValueError):
                    raise ValueError(
                        f"assignment of {rid!r} has malformed entry {entry!r}"
                    ) from None
                if not np.isfinite(w_f) or w_f < 0:
                    raise ValueError(f"assignment of {rid!r}: weight {w!r} must be finite and >= 0")
                rows.append([cid_i, w_f])
            clean_assign[rid] = rows
        arrays, smeta = strategy_state if strategy_state is not None else ({}, {})
        state_names: list[str] = []
        for i, (key, arr) in enumerate(arrays.items()):
            if not isinstance(key, str):
                raise ValueError(f"strategy array key {key!r} is not a string")
            arr = np.asarray(arr)
            if arr.dtype.kind not in "biuf" or arr.dtype.hasobject:
                raise ValueError(f"strategy array {key!r} has unsupported dtype {arr.dtype}")
            if arr.dtype.kind == "f" and not np.isfinite(arr).all():
                raise ValueError(f"strategy array {key!r} holds NaN/Inf values")
            state_names.append(key)
            files.append((f"state_{i}.npy", array_writer(arr)))
        meta_obj = {
            "round": int(round_idx),
            "manifests": manifests,
            "assignments": clean_assign,
            "state_names": state_names,
            "strategy_meta": dict(smeta),
            "meta": dict(meta or {}),
        }
        meta_bytes = _dumps(meta_obj, "store meta / strategy meta")
        files.append((META_NAME, lambda w: w.write(meta_bytes)))
        return {"files": files}

    def _prune(self) -> None:
        rounds = self.committed_rounds()
        for r in rounds[: -self.keep]:
            shutil.rmtree(self.directory / f"round_{r:08d}", ignore_errors=True)
        # Uncommitted directories older than the newest commit are crash leftovers.
        if rounds:
            for r in self._all_round_dirs():
                if r < rounds[-1] and r not in rounds:
                    shutil.rmtree(self.directory / f"round_{r:08d}", ignore_errors=True)

    # ------------------------------------------------------------------------------- load
    def _all_round_dirs(self) -> list[int]:
        out = []
        for p in self.directory.iterdir():
            m = _ROUND_RE.fullmatch(p.name)  # not .match: "$" also matches before a trailing "\n"
            if m and p.is_dir():
                out.append(int(m.group(1)))
        return sorted(out)

    def committed_rounds(self) -> list[int]:
        """Rounds whose manifest exists (not yet checksum-verified), oldest first."""
        return [
            r
            for r in self._all_round_dirs()
            if (self.directory / f"round_{r:08d}" / MANIFEST_NAME).exists()
        ]

    def load_latest(self) -> StoreSnapshot | None:
        """Newest round that verifies completely, or None.

        Skipped rounds are logged with the reason.
        """
        skipped: list[tuple[int, str]] = []
        for r in reversed(self._all_round_dirs()):
            try:
                snap = self.load_round(r)
            except ValueError as exc:
                log.warning("model store: skipping round %d: %s", r, exc)
                skipped.append((r, str(exc)))
                continue
            snap.skipped = skipped
            return snap
        return None

    def load_round(self, round_idx: int) -> StoreSnapshot:
        """Load and verify one round; raises ValueError saying what is wrong."""
        rdir = self.directory / f"round_{int(round_idx):08d}"
        mpath = rdir / MANIFEST_NAME
        if not mpath.exists():
            raise ValueError("not committed (no MANIFEST.json)")
        try:
            man = json.loads(mpath.read_bytes())
            files = dict(man["files"])
            if int(man["round"]) != int(round_idx) or int(man["format"]) != FORMAT_VERSION:
                raise ValueError(
                    f"manifest round/format {man.get('round')}/{man.get('format')} mismatch"
                )
        except (json.JSONDecodeError, KeyError, TypeError, UnicodeDecodeError) as exc:
            raise ValueError(f"corrupt MANIFEST.json ({exc})") from None
        for name, digest in files.items():
            path = rdir / name
            if "/" in name or name.startswith(".") or not path.is_file():
                raise ValueError(f"file {name!r} listed in manifest is missing")
            got = _sha256_file(path)
            if got != digest:
                raise ValueError(f"checksum mismatch for {name!r}")
        if META_NAME not in files:
            raise ValueError("manifest does not list meta.json")
        try:
            meta = json.loads((rdir / META_NAME).read_bytes())
            manifests = {int(c): manifest_from_json(m) for c, m in meta["manifests"].items()}
            state_names = list(meta["state_names"])
            assignments = {
                str(rid): [(int(c), float(w)) for c, w in mem]
                for rid, mem in meta["assignments"].items()
            }
        except (json.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"corrupt meta.json ({exc})") from None
        models: dict[int, StateDict] = {}
        for cid, manifest in manifests.items():
            name = f"cluster_{cid}.npy"
            if name not in files:
                raise ValueError(f"manifest does not list {name}")
            vec = load_npy(rdir / name)
            if vec.dtype != np.float32 or vec.shape != (num_params(manifest),):
                raise ValueError(
                    f"{name} has shape {vec.shape} dtype {vec.dtype}, manifest says "
                    f"({num_params(manifest)},) float32"
                )
            models[cid] = unflatten(vec, manifest)
        arrays: dict[str, np.ndarray] = {}
        for i, key in enumerate(state_names):
            name = f"state_{i}.npy"
            if name not in files:
                raise ValueError(f"manifest does not list {name}")
            arrays[key] = load_npy(rdir / name)
        return StoreSnapshot(
            int(round_idx),
            models,
            assignments,
            arrays,
            dict(meta.get("strategy_meta", {})),
            dict(meta.get("meta", {})),
        )
