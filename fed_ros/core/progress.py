"""Progress with an ETA, for the long jobs that log instead of drawing a bar (a robot node's
training under launch, where stdout is no terminal)."""

from __future__ import annotations


def eta_seconds(done: int, total: int, elapsed_s: float) -> float | None:
    """Seconds left at the pace so far (None before the first unit or without a total)."""
    if done <= 0 or total <= 0 or elapsed_s < 0:
        return None
    return max(0.0, elapsed_s * (total - done) / done)


def progress_text(done: int, total: int, elapsed_s: float, unit: str = "step") -> str:
    """``"step 120 of 400, about 35 s left"`` (or ``"step 120"`` without a total)."""
    if total <= 0:
        return f"{unit} {done}"
    eta = eta_seconds(done, total, elapsed_s)
    left = "" if eta is None else f", about {eta:.0f} s left"
    return f"{unit} {done} of {total}{left}"
