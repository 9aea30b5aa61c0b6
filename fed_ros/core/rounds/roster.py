"""The server's registration roster, and whether it may start (pure, no ROS).

Who has registered (id, tasks, sample count, GPU, public key; re-registration with the same
key after a restart; an optional allow-list; trust on first use without one), the decision
to announce the first round (:func:`ready_to_start`). A registration is answered with a
:class:`fed_ros.core.checks.decisions.Decision`, like every other input the server judges.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Collection, Mapping, Sequence

from fed_ros.core.checks.decisions import ACCEPTED, Decision, REGISTER

_ID_RE = re.compile(r"^[A-Za-z][A-Za-z0-9_]*$")


def ready_to_start(
    *,
    registered: Collection[str],
    expected: Collection[str],
    min_robots: int,
    waited_s: float,
    registration_timeout_s: float,
    resumed: bool = False,
) -> bool:
    """Whether the server may announce its first round, given who has registered so far.

    A resumed server carries on as soon as its committed roster holds anyone (robots
    re-register as they come back). Otherwise it waits for every ``expected`` robot, or,
    without an expected list, for ``min_robots``; once more than ``registration_timeout_s``
    have passed it starts with whoever registered if that is at least ``min_robots``.
    """
    count = len(registered)
    if resumed and count:
        return True
    if expected:
        if all(r in registered for r in expected):
            return True
    elif count >= min_robots:
        return True
    return waited_s > registration_timeout_s and count >= min_robots


@dataclass
class RobotEntry:
    """What the server knows about a registered robot."""

    robot_id: str
    tasks: tuple[str, ...] = ()
    num_samples: int = 0
    has_gpu: bool = False
    public_key: bytes = b""
    registrations: int = 1

    def to_json(self) -> dict[str, Any]:
        """JSON form for the store's round meta."""
        return {
            "robot_id": self.robot_id,
            "tasks": list(self.tasks),
            "num_samples": self.num_samples,
            "has_gpu": self.has_gpu,
            "public_key": self.public_key.hex(),
        }

    @staticmethod
    def from_json(obj: Mapping[str, Any]) -> "RobotEntry":
        """Inverse of :meth:`to_json`."""
        return RobotEntry(
            robot_id=str(obj["robot_id"]),
            tasks=tuple(obj.get("tasks", ())),
            num_samples=int(obj.get("num_samples", 0)),
            has_gpu=bool(obj.get("has_gpu", False)),
            public_key=bytes.fromhex(str(obj.get("public_key", ""))),
        )


class Roster:
    """Registered robots. A robot may re-register (after a restart) with the same key."""

    def __init__(
        self,
        action_dim: int = 4,
        max_robots: int = 10_000,
        allowed_keys: Mapping[str, bytes] | None = None,
        max_samples: int = 1_000_000,
    ) -> None:
        self.action_dim = action_dim
        self.max_robots = max_robots
        self.allowed_keys = dict(allowed_keys) if allowed_keys is not None else None
        self.max_samples = max_samples
        self._robots: dict[str, RobotEntry] = {}

    def register(
        self,
        robot_id: str,
        tasks: Sequence[str] = (),
        num_samples: int = 0,
        has_gpu: bool = False,
        public_key: bytes = b"",
        action_dim: int | None = None,
    ) -> Decision:
        """Add or refresh a robot; rejects bad ids, action spaces and keys with a reason."""
        # fullmatch: with match, "$" also matches before a trailing newline ("robot_0\n" passed).
        if not isinstance(robot_id, str) or not _ID_RE.fullmatch(robot_id):
            return Decision(
                False, REGISTER, f"bad robot id {robot_id!r} (must match {_ID_RE.pattern})"
            )
        if action_dim is not None and action_dim != self.action_dim:
            return Decision(
                False, REGISTER, f"action_dim {action_dim} != fleet action_dim {self.action_dim}"
            )
        if num_samples < 0:
            return Decision(False, REGISTER, f"negative num_samples {num_samples}")
        key = bytes(public_key)
        if self.allowed_keys is not None:
            allowed = self.allowed_keys.get(robot_id)
            if allowed is None:
                return Decision(False, REGISTER, f"robot {robot_id!r} is not on the allow-list")
            if key != allowed:
                return Decision(
                    False, REGISTER, f"public key of {robot_id!r} does not match the allow-list"
                )
        entry = self._robots.get(robot_id)
        if entry is None:
            if len(self._robots) >= self.max_robots:
                return Decision(False, REGISTER, f"fleet is full ({self.max_robots} robots)")
            self._robots[robot_id] = RobotEntry(
                robot_id, tuple(tasks), min(num_samples, self.max_samples), bool(has_gpu), key
            )
            return ACCEPTED
        if entry.public_key and key != entry.public_key:
            # Without an allow-list the first key a robot used is pinned (trust on first use).
            return Decision(
                False, REGISTER, f"robot {robot_id!r} re-registered with a different public key"
            )
        entry.tasks, entry.num_samples, entry.has_gpu = (
            tuple(tasks),
            min(num_samples, self.max_samples),
            bool(has_gpu),
        )
        entry.public_key = entry.public_key or key
        entry.registrations += 1
        return ACCEPTED

    def __contains__(self, robot_id: object) -> bool:
        return robot_id in self._robots

    def __len__(self) -> int:
        return len(self._robots)

    def get(self, robot_id: str) -> RobotEntry | None:
        """The entry of a robot, or None."""
        return self._robots.get(robot_id)

    @property
    def ids(self) -> list[str]:
        """Registered robot ids, sorted (deterministic participant order)."""
        return sorted(self._robots)

    def to_json(self) -> list[dict[str, Any]]:
        """JSON form (persisted with every committed round)."""
        return [self._robots[r].to_json() for r in self.ids]

    def load_json(self, entries: Sequence[Mapping[str, Any]]) -> None:
        """Restore robots persisted by :meth:`to_json` (after a server restart)."""
        for obj in entries:
            entry = RobotEntry.from_json(obj)
            entry.registrations = 0  # known from the store; not yet seen by this process
            self._robots[entry.robot_id] = entry

    def save_file(self, path: Path) -> None:
        """Keep the roster in a JSON file (until a committed round carries it)."""
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(json.dumps(self.to_json()), encoding="utf-8")
        os.replace(tmp, path)  # atomic: a kill leaves the old or the new roster

    def load_file(self, path: Path) -> None:
        """Restore robots from a file written by :meth:`save_file`."""
        self.load_json(json.loads(path.read_text(encoding="utf-8")))
