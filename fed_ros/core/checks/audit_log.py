"""The audit log: one JSON line per accept/reject decision, plus per-round counters for round
reports."""

from __future__ import annotations

import json
import os
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from fed_ros.core.checks.decisions import Decision, _is_int

_MiB = 1 << 20


@dataclass
class RoundCounters:
    """Accept/reject counts of one round, for RoundReport."""

    received: int = 0
    accepted: int = 0
    rejected: int = 0
    by_code: dict[str, int] = field(default_factory=dict)
    reasons: dict[str, str] = field(
        default_factory=dict
    )  # robot id -> last reason ("accepted" if ok)


class AuditLog:
    """One JSON line per accept/reject (append-only, flushed per line) plus per-round counters.

    Thread-safe (node callbacks may run on several executor threads). Counters are kept for the
    last `keep_rounds` rounds so memory stays bounded on a long-running server.
    """

    def __init__(
        self,
        path: str | Path | None = None,
        *,
        keep_rounds: int = 64,
        fsync: bool = False,
        max_bytes: int = 8 * _MiB,
        backups: int = 1,
    ):
        if keep_rounds < 1:
            raise ValueError(f"keep_rounds must be >= 1, got {keep_rounds}")
        if max_bytes < 1024 or backups < 0:
            raise ValueError(
                f"max_bytes must be >= 1024 and backups >= 0, got {max_bytes}, {backups}"
            )
        self.path = Path(path) if path is not None else None
        self.keep_rounds = keep_rounds
        self.fsync = fsync
        # Rotation (size cap): at most max_bytes x (1 + backups) on disk, whatever peers send.
        self.max_bytes, self.backups = int(max_bytes), int(backups)
        self._written = 0
        self._lock = threading.Lock()
        self._counters: OrderedDict[int, RoundCounters] = OrderedDict()
        self._file: TextIO | None = None
        if self.path is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._file = open(self.path, "a", encoding="utf-8")
            self._written = self._file.tell()

    def _rotate(self) -> None:
        """audit.jsonl -> audit.jsonl.1 -> ... (the oldest beyond ``backups`` is dropped)."""
        path, file = self.path, self._file
        assert path is not None and file is not None  # record() rotates only an open log
        file.close()
        for i in range(self.backups, 0, -1):
            src = path if i == 1 else path.with_name(f"{path.name}.{i - 1}")
            if src.exists():
                os.replace(src, path.with_name(f"{path.name}.{i}"))
        if self.backups == 0:
            path.unlink(missing_ok=True)
        self._file = open(path, "a", encoding="utf-8")
        self._written = 0

    def record(
        self, *, kind: str, robot_id: Any, round_idx: Any, decision: Decision, **extra: Any
    ) -> Decision:
        """Log one decision (kind: "update", "descriptor", "cluster_model", ...); returns it."""
        entry = {
            "time": round(time.time(), 6),
            "kind": str(kind)[:40],
            "robot_id": str(robot_id)[:255],
            "round": int(round_idx) if _is_int(round_idx) else str(round_idx)[:40],
            "accepted": decision.accepted,
            "code": str(decision.code)[:40],
            "reason": decision.reason[:1000],
        }
        # Extra fields are peer-controlled too (payload ids, digests): truncated like the rest.
        entry.update(
            {
                str(k)[:40]: (v if isinstance(v, (int, float, bool)) or v is None else str(v)[:256])
                for k, v in list(extra.items())[:16]
                if k not in entry
            }
        )
        line = json.dumps(entry, default=str, ensure_ascii=True)
        with self._lock:
            if _is_int(round_idx):
                c = self._counters.get(int(round_idx))
                if c is None:
                    c = self._counters[int(round_idx)] = RoundCounters()
                    while len(self._counters) > self.keep_rounds:
                        self._counters.popitem(last=False)
                c.received += 1
                c.accepted += int(decision.accepted)
                c.rejected += int(not decision.accepted)
                c.by_code[decision.code] = c.by_code.get(decision.code, 0) + 1
                key = str(robot_id)[:255]
                if (
                    key in c.reasons or len(c.reasons) < 1024
                ):  # bounded: junk ids only bump the counts
                    c.reasons[key] = decision.reason[:1000]
            if self._file is not None:
                if self._written + len(line) + 1 > self.max_bytes:
                    self._rotate()
                self._file.write(line + "\n")
                self._written += len(line) + 1
                self._file.flush()
                if self.fsync:
                    os.fsync(self._file.fileno())
        return decision

    def counters(self, round_idx: int) -> RoundCounters:
        """Counts for one round (zeros if nothing was recorded); a copy."""
        with self._lock:
            c = self._counters.get(int(round_idx), RoundCounters())
            return RoundCounters(
                c.received, c.accepted, c.rejected, dict(c.by_code), dict(c.reasons)
            )

    def close(self) -> None:
        """Close the log file."""
        with self._lock:
            if self._file is not None:
                self._file.close()
                self._file = None

    def __enter__(self) -> "AuditLog":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def read_audit_log(path: str | Path) -> list[dict[str, Any]]:
    """All entries of an audit log file (skips a torn last line after a crash)."""
    out = []
    for line in Path(path).read_text(encoding="utf-8").splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return out
