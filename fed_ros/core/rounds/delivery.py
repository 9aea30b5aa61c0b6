"""Delivery bookkeeping of model transfers: acknowledgements, re-sends, idempotent receipt.

Pure logic (no ROS), used by the transfer objects in ``fed_ros/ros/wire/transfer.py`` and
``transfer_receiver.py``:

- ``RetrySchedule``: when an unacknowledged payload is sent again (exponential, capped).
- ``Outbox`` (sending side, e.g. a robot's update): what was sent and not yet acknowledged,
  and which entries are due for a re-send now. A re-send is the *same* cached payload.
- ``Ledger`` (receiving side, e.g. the server): the decision on each payload id, so a
  re-send of a decided payload is answered with the same decision and never applied twice.
"""

from __future__ import annotations

import random
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from fed_ros.core.checks.decisions import Decision


@dataclass(frozen=True)
class RetrySchedule:
    """Delay before re-send k (k = 1, 2, ...): first_s * factor**(k-1), at most max_s, then
    spread by +-``jitter`` of itself.

    Why the jitter: robots whose updates were dropped together (a burst beyond the server's
    KEEP_LAST inbox) re-sent on the same deterministic schedule all came back at the same
    instant, and the inbox dropped all but a few of them again: at N = 100 robots sending at
    once, each update went out 3-4 times and the round took 45 s for 2.7 s of server CPU
    (docs/fleet.md "A thousand robots"). A random delay in [1 - jitter, 1 + jitter] x the
    schedule spreads the re-sends over the window ("equal jitter" of exponential back-off).
    """

    first_s: float = 2.0
    factor: float = 2.0
    max_s: float = 10.0
    jitter: float = 0.0

    def __post_init__(self) -> None:
        if not self.first_s > 0:
            raise ValueError(f"RetrySchedule.first_s must be > 0, got {self.first_s}")
        if not self.factor >= 1:
            raise ValueError(f"RetrySchedule.factor must be >= 1, got {self.factor}")
        if not self.max_s >= self.first_s:
            raise ValueError(
                f"RetrySchedule.max_s must be >= first_s ({self.first_s}), got {self.max_s}"
            )
        if not 0.0 <= self.jitter < 1.0:
            raise ValueError(f"RetrySchedule.jitter must be in [0, 1), got {self.jitter}")

    def delay(self, attempt: int, draw: float = 0.5) -> float:
        """Seconds to wait after send number ``attempt`` (1 = the first send) before the next.

        ``draw`` in [0, 1] places the delay in the jitter band (0.5: its middle, the schedule's
        own value); without jitter it has no effect.
        """
        if attempt < 1:
            raise ValueError(f"attempt must be >= 1, got {attempt}")
        if not 0.0 <= draw <= 1.0:
            raise ValueError(f"draw must be in [0, 1], got {draw}")
        base = min(self.max_s, self.first_s * self.factor ** min(attempt - 1, 64))
        return base * (1.0 + self.jitter * (2.0 * draw - 1.0))


@dataclass
class OutboxEntry:
    """One sent payload awaiting its acknowledgement."""

    round_idx: int
    payload_id: str
    item: Any  # what the owner needs to send it again (sender object, header)
    deadline: float  # no re-send after this time (the round's deadline, on the outbox clock)
    sends: int = 1
    next_due: float = 0.0
    decision: Decision | None = None  # the receiver's answer, once acknowledged
    added_at: float = 0.0  # when it was added or reopened (outbox clock)


class Outbox:
    """Sending side: payloads sent and not yet acknowledged.

    Each is re-sent on a schedule until the deadline.
    """

    def __init__(
        self,
        schedule: RetrySchedule | None = None,
        clock: Callable[[], float] = time.monotonic,
        draw: Callable[[], float] | None = None,
    ) -> None:
        self.schedule = schedule or RetrySchedule()
        self._clock = clock
        # Where each re-send falls in the schedule's jitter band (uniform [0, 1)); injectable so
        # tests replay a sequence. Each robot process draws its own.
        self._draw = draw or random.Random().random
        self._entries: dict[int, OutboxEntry] = {}

    def _delay(self, attempt: int) -> float:
        return self.schedule.delay(attempt, self._draw() if self.schedule.jitter else 0.5)

    def add(self, round_idx: int, payload_id: str, item: Any, deadline: float) -> OutboxEntry:
        """Record a payload just sent for ``round_idx`` (replaces an older one of that round)."""
        if not payload_id:
            raise ValueError("payload_id must not be empty")
        now = self._clock()
        entry = OutboxEntry(
            round_idx=int(round_idx),
            payload_id=payload_id,
            item=item,
            deadline=float(deadline),
            next_due=now + self._delay(1),
            added_at=now,
        )
        self._entries[int(round_idx)] = entry
        return entry

    def for_round(self, round_idx: int) -> OutboxEntry | None:
        """The cached payload of a round (a re-announced round re-sends it, it is not retrained)."""
        return self._entries.get(int(round_idx))

    def acknowledge(self, payload_id: str, decision: Decision) -> OutboxEntry | None:
        """Record the receiver's decision.

        Returns the entry the first time, None if unknown or repeated.
        """
        for entry in self._entries.values():
            if entry.payload_id == payload_id:
                if entry.decision is not None:
                    return None
                entry.decision = decision
                return entry
        return None

    def reopen(
        self, round_idx: int, payload_id: str, item: Any, deadline: float
    ) -> OutboxEntry | None:
        """A re-announced round: the cached entry goes out again under a new id (same payload)."""
        entry = self._entries.get(int(round_idx))
        if entry is None:
            return None
        entry.payload_id, entry.item, entry.deadline = payload_id, item, float(deadline)
        entry.decision, entry.sends = None, 1
        entry.added_at = self._clock()
        entry.next_due = entry.added_at + self._delay(1)
        return entry

    def due(self, now: float | None = None) -> list[OutboxEntry]:
        """Unacknowledged entries whose re-send time has come (each call counts as one re-send)."""
        now = self._clock() if now is None else now
        out = []
        for entry in self._entries.values():
            if entry.decision is not None or now > entry.deadline or now < entry.next_due:
                continue
            entry.sends += 1
            entry.next_due = now + self._delay(entry.sends)
            out.append(entry)
        return out

    def expedite(
        self, now: float | None = None, added_before: float | None = None
    ) -> list[OutboxEntry]:
        """The receiver is reachable again (e.g. re-matched after a link outage longer than the
        DDS lease): unacknowledged entries are due now and their back-off starts over, so the
        update goes out at once and a lost acknowledgement is retried after ``first_s``, not
        after the capped delay the outage had grown it to. ``added_before``: only entries sent
        before then (e.g. when the receiver was lost; later ones went to the re-matched receiver).
        Returns the entries made due."""
        now = self._clock() if now is None else now
        out = []
        for entry in self._entries.values():
            if added_before is not None and entry.added_at >= added_before:
                continue
            if entry.decision is None and now <= entry.deadline:
                entry.sends, entry.next_due = 0, now
                out.append(entry)
        return out

    def forget_before(self, round_idx: int) -> None:
        """Drop the entries of rounds before ``round_idx`` (those rounds are over)."""
        self._entries = {r: e for r, e in self._entries.items() if r >= round_idx}


@dataclass
class Ledger:
    """Receiving side: the decision on each payload id (bounded), answered again on a re-send."""

    max_ids: int = 100_000
    _decisions: OrderedDict[str, tuple[int, Decision]] = field(default_factory=OrderedDict)

    def __post_init__(self) -> None:
        if self.max_ids < 1:
            raise ValueError(f"Ledger.max_ids must be >= 1, got {self.max_ids}")

    def decided(self, payload_id: str) -> Decision | None:
        """The decision already taken on ``payload_id`` (None: not decided, collect it)."""
        hit = self._decisions.get(payload_id)
        return hit[1] if hit else None

    def decide(self, payload_id: str, round_idx: int, decision: Decision) -> None:
        """Record the decision on a payload (the oldest ids are forgotten beyond max_ids)."""
        self._decisions[payload_id] = (int(round_idx), decision)
        self._decisions.move_to_end(payload_id)
        while len(self._decisions) > self.max_ids:
            self._decisions.popitem(last=False)

    def reopen(self, round_idx: int) -> None:
        """A round is announced again: its payloads are collected fresh.

        Its earlier attempt was abandoned.
        """
        for pid in [p for p, (r, _) in self._decisions.items() if r == int(round_idx)]:
            del self._decisions[pid]

    def __len__(self) -> int:
        return len(self._decisions)
