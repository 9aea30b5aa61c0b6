"""Quarantine: a demonstration that cannot become training data is moved aside with its reason.

A refused recording (a STOP whose bag lacks observations, an arm that never moved) or a file
that no longer reads (a truncated MCAP, an episode file cut short) would otherwise stay among a
robot's demonstrations and fail every later load: every STOP after it and every round's
training. Moved to ``<demos>/quarantine/<name>`` with ``<name>.reason.txt`` beside it, it costs
one episode and never the robot. Nothing under ``quarantine/`` is loaded again; a person may
inspect it, repair it and move it back.
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path

QUARANTINE_DIR = "quarantine"
REASON_SUFFIX = ".reason.txt"


def is_quarantined(path: str | Path, demo_dir: str | Path) -> bool:
    """Whether ``path`` lies in the quarantine of ``demo_dir``."""
    try:
        parts = Path(path).relative_to(demo_dir).parts
    except ValueError:
        return False
    return QUARANTINE_DIR in parts


def quarantine(path: str | Path, reason: str, demo_dir: str | Path) -> Path | None:
    """Move ``path`` (a file or a recording folder) into ``demo_dir/quarantine`` and write why
    beside it; returns where it went, None when it was already gone (another caller moved it)."""
    path, demo_dir = Path(path), Path(demo_dir)
    if not reason:
        raise ValueError(f"quarantining {path} needs a reason, got {reason!r}")
    target_dir = demo_dir / QUARANTINE_DIR
    target_dir.mkdir(parents=True, exist_ok=True)
    target = target_dir / path.name
    copy = 1
    while target.exists() or target.with_name(target.name + REASON_SUFFIX).exists():
        copy += 1
        target = target_dir / f"{path.name}.{copy}"
    try:
        shutil.move(str(path), str(target))
    except FileNotFoundError:
        return None
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    target.with_name(target.name + REASON_SUFFIX).write_text(
        f"{path}\nquarantined {stamp}\n{reason}\n"
    )
    return target


__all__ = ["QUARANTINE_DIR", "REASON_SUFFIX", "is_quarantined", "quarantine"]
