"""Replay protection of signed fleet messages: a round floor and bounded memory of used nonces."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Mapping
from typing import Any

from fed_ros.core.security.signed_messages import NONCE_BYTES


class ReplayGuard:
    """Rejects updates of rounds below a floor and reused nonces, with bounded memory.

    ``check`` is pure; ``record`` stores an accepted nonce. Nonces of rounds below the floor are
    forgotten because such rounds are rejected anyway. When more than ``max_nonces`` are held the
    oldest are evicted and the floor rises past them, so an evicted nonce can never be replayed.
    ``on_change(guard)`` runs after every change of the state (a recorded nonce, a raised floor):
    a server persists the guard there (``replay_file``), so a restart keeps refusing replays.
    """

    def __init__(
        self,
        max_nonces: int = 100_000,
        window_rounds: int = 1,
        on_change: Callable[["ReplayGuard"], None] | None = None,
    ):
        if max_nonces < 1:
            raise ValueError(f"max_nonces must be >= 1, got {max_nonces}")
        if window_rounds < 1:
            raise ValueError(f"window_rounds must be >= 1, got {window_rounds}")
        self.max_nonces = int(max_nonces)
        self.window_rounds = int(window_rounds)
        self.floor = 0  # lowest round still accepted
        self._nonces: OrderedDict[bytes, int] = OrderedDict()  # nonce -> round, insertion order
        self.on_change = on_change

    def advance(self, current_round: int) -> None:
        """Start `current_round`: rounds older than the window are rejected from now on."""
        new_floor = max(self.floor, int(current_round) - self.window_rounds + 1)
        if new_floor != self.floor:
            self.floor = new_floor
            for nonce in [n for n, r in self._nonces.items() if r < new_floor]:
                del self._nonces[nonce]
            self._changed()

    def check(self, robot_id: str, round_idx: int, nonce: bytes) -> str | None:
        """None if (round, nonce) is fresh, else the reject reason; changes nothing."""
        if round_idx < self.floor:
            return (
                f"robot {robot_id!r}: round {round_idx} is older than the oldest open round "
                f"{self.floor}"
            )
        key = bytes(nonce)
        if len(key) != NONCE_BYTES:
            return f"robot {robot_id!r}: nonce must be {NONCE_BYTES} bytes, got {len(key)}"
        if key in self._nonces:
            return f"robot {robot_id!r}: nonce {key.hex()} already used (replay)"
        return None

    def record(self, robot_id: str, round_idx: int, nonce: bytes) -> None:
        """Remember an accepted nonce; evicts the oldest beyond `max_nonces` and raises the
        floor."""
        self._nonces[bytes(nonce)] = int(round_idx)
        while len(self._nonces) > self.max_nonces:
            _, evicted_round = self._nonces.popitem(last=False)
            self.floor = max(self.floor, evicted_round + 1)
        self._changed()

    def _changed(self) -> None:
        if self.on_change is not None:
            self.on_change(self)

    def __len__(self) -> int:
        return len(self._nonces)

    def state(self) -> dict[str, Any]:
        """JSON-able state, so a server can persist it with its round state."""
        return {"floor": self.floor, "nonces": [[n.hex(), r] for n, r in self._nonces.items()]}

    def load_state(self, state: Mapping[str, Any]) -> None:
        """Restore `state()`; ValueError on malformed input."""
        try:
            floor = int(state["floor"])
            nonces = OrderedDict((bytes.fromhex(n), int(r)) for n, r in state["nonces"])
        except (KeyError, TypeError, ValueError) as err:
            raise ValueError(f"bad replay-guard state: {err}") from None
        self.floor, self._nonces = floor, nonces
