"""The replay guard on disk: the server's used nonces survive a restart.

A server killed mid-round resumes from its last committed round; without its replay guard it
would accept, once more, every signed update and descriptor it had already taken in the open
round (a captured message replayed after the restart). The guard's state (``ReplayGuard.state``:
the round floor and the nonces of the open window) is small, so it is rewritten whole after
every change: to a temporary file, fsynced, then renamed over the old one, so a crash leaves
either the old state or the new, never a torn file. A file that exists but cannot be read as a
guard state stops the server with its path named: starting with an empty guard would silently
reopen every replay.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from fed_ros.core.security.replay import ReplayGuard

GUARD_FILE = "replay_guard.json"


def save_guard(guard: ReplayGuard, path: Path) -> None:
    """Write ``guard``'s state to ``path`` atomically (tmp + fsync + rename + directory fsync)."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(guard.state(), f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def persistent_guard(state_dir: Path, **settings: Any) -> ReplayGuard:
    """The server's replay guard: restored from ``state_dir/replay_guard.json`` when it exists,
    saved there after every change. ValueError naming the file when it is unreadable."""
    path = Path(state_dir) / GUARD_FILE
    guard = ReplayGuard(**settings)
    if path.exists():
        try:
            state = json.loads(path.read_text(encoding="utf-8"))
            guard.load_state(state)
        except (OSError, ValueError, TypeError, AttributeError) as err:
            raise ValueError(f"replay guard file {path} is unreadable: {err}") from None
    path.parent.mkdir(parents=True, exist_ok=True)
    guard.on_change = lambda g: save_guard(g, path)
    return guard
