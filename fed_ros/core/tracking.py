"""Experiment tracking, the part without a backend: the kinds, the interface (which tracks
nothing) and which values are worth writing. The TensorBoard and MLflow backends are in
:mod:`fed_ros.learning.tracking` (optional extras); parameters and the fleet plan need only this.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

TRACKING_KINDS = ("auto", "tensorboard", "mlflow", "none")


class Tracker:
    """Scalars by tag and step; the base class tracks nothing (``tracking: none``)."""

    kind = "none"
    location = ""

    def scalars(self, values: Mapping[str, float], step: int) -> None:
        """Record ``values`` (tag -> number) at ``step``; non-finite values are skipped."""

    def flush(self) -> None:
        """Make what was recorded visible to readers (TensorBoard reloads files as they grow)."""

    def close(self) -> None:
        """Flush and release the files."""


def finite_items(values: Mapping[str, Any]) -> list[tuple[str, float]]:
    """The (tag, float) pairs worth writing: numbers only, NaN and inf left out (NaN means
    "not measured this step", e.g. a robot that did not evaluate)."""
    out = []
    for tag, value in values.items():
        try:
            number = float(value)
        except (TypeError, ValueError):
            continue
        if math.isfinite(number):
            out.append((str(tag), number))
    return out
