"""Fault injection for crash tests: a process kills itself (SIGKILL) at a named step of a round.

Off unless the environment variable ``FED_ROS_CRASH_AT`` is set (never in a fleet file, never
in production); then it lists ``<step>@<round>[#<n>]`` items separated by commas, e.g.
``update_accepted@1#2`` (the second update of round 1 accepted and acknowledged: every update
in, nothing aggregated yet) or ``written:manifest@2`` (round 2 aggregated and its files
written, its manifest not yet renamed into place: between aggregation and the commit point).
The process dies by SIGKILL at the ``n``-th time (default the first) it reaches that step for
that round: no cleanup, no flush, no atexit, exactly like a power cut of the server.

Steps the server reaches: ``update_accepted`` (fed_ros/ros/nodes/server/updates.py) and every
ModelStore commit step (``begin``, ``written:<file>``, ``renamed:<file>``, ``synced:<file>``,
``written:manifest`` ... ``committed``; fed_ros/core/rounds/store.py).
"""

from __future__ import annotations

import os
import signal
from collections.abc import Callable

ENV = "FED_ROS_CRASH_AT"
_reached: dict[tuple[str, int], int] = {}


def parse(spec: str) -> list[tuple[str, int, int]]:
    """``"a@1#2,b@3"`` -> [("a", 1, 2), ("b", 3, 1)]; ValueError on a malformed item."""
    out = []
    for item in filter(None, (s.strip() for s in spec.split(","))):
        step, sep, rest = item.rpartition("@")
        if not sep or not step:
            raise ValueError(f"{ENV} item {item!r} is not <step>@<round>[#<n>]")
        round_text, _, nth = rest.partition("#")
        out.append((step, int(round_text), int(nth or 1)))
    return out


def reach(step: str, round_idx: int, environ=os.environ) -> None:
    """Mark ``step`` of ``round_idx`` reached; SIGKILL this process if the environment asks for
    it."""
    spec = environ.get(ENV)
    if not spec:
        return
    key = (step, int(round_idx))
    _reached[key] = _reached.get(key, 0) + 1
    for s, r, n in parse(spec):
        if (s, r) == key and _reached[key] == n:
            os.kill(os.getpid(), signal.SIGKILL)


def store_hook(current_round: Callable[[], int]) -> Callable[[str], None]:
    """A ModelStore ``_crash_point`` that reaches each commit step for the round being committed."""
    return lambda step: reach(step, current_round())
