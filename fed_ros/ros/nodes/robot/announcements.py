"""Which round announcements a robot acts on, and when a queued one is stale.

The server re-publishes its latched announcement (late joiners, resends), so the same stage
arrives many times; a robot must do each stage's work once, never obey an unsigned or forged
announcement, skip rounds it does not take part in or while learning is off, and drop a queued
stage the server has already moved past. The node's subscription hands every message here;
what comes back is the work to queue.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from fed_ros.core.rounds.collect import DONE
from fed_ros.ros.wire.round_msgs import Announcement, announcement_from_msg
from fed_ros.ros.wire.signed import verify_msg


class AnnouncementFollower:
    """The newest announcement, and the (round, stage, stamp) keys already queued.

    ``refuse(kind, why)`` reports a message that failed its signature check; ``skip(what)`` is
    the learning gate's (true while learning is off, and it says so)."""

    def __init__(
        self,
        robot_id: str,
        server_key,
        refuse: Callable[[str, str], None],
        skip: Callable[[str], bool],
        log: Any,
    ) -> None:
        self.robot_id, self.server_key, self.refuse, self.skip, self.log = (
            robot_id,
            server_key,
            refuse,
            skip,
            log,
        )
        self.latest: Announcement | None = None
        self._latest_stamp = 0
        self._handled: set[tuple[int, str, int]] = set()

    def on_message(self, msg) -> tuple[Announcement, int] | None:
        """The (announcement, stamp) to queue for the worker, or None."""
        why = verify_msg(msg, "round", self.server_key)  # a fake server's is never obeyed
        if why is not None:
            self.refuse("round", why)
            return None
        try:
            ann = announcement_from_msg(msg)
        except ValueError as exc:
            self.log.warning(f"bad round announcement: {exc}")
            return None
        stamp = msg.header.stamp.sec * 1_000_000_000 + msg.header.stamp.nanosec
        self.latest, self._latest_stamp = ann, stamp
        if ann.stage == DONE:
            self.log.info(f"federation finished at round {ann.round_idx}")
            return None
        if self.robot_id not in ann.participants or self.skip(f"round {ann.round_idx} {ann.stage}"):
            return None
        key = (ann.round_idx, ann.stage, stamp)
        if key in self._handled:
            return None
        self._handled.add(key)
        return ann, stamp

    def still_due(self, ann: Announcement, stamp: int) -> bool:
        """Whether a queued stage is still the server's, and before its deadline."""
        latest = self.latest
        if (
            self._latest_stamp != stamp
            and latest is not None
            and (latest.round_idx, latest.stage) != (ann.round_idx, ann.stage)
        ):
            return False  # superseded while queued (e.g. a straggler's stage already closed)
        if ann.deadline_s < time.time():
            self.log.warning(
                f"round {ann.round_idx} {ann.stage}: deadline already passed, skipping"
            )
            return False
        return True
