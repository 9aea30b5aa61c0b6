"""Experiment tracking: scalars to TensorBoard event files (or MLflow) behind one small interface.

A server writes each round's outcome, a robot its training losses per step and its evaluations,
``fed-ros bench federation`` each cell's rounds. A fleet's runs land in one tree,
``<run_dir>/tb/<server|robot id>``, so ``tensorboard --logdir runs`` shows every run of every
fleet side by side. Both backends are optional extras: ``open_tracker("auto", ...)`` uses
TensorBoard when it is installed and otherwise tracks nothing and says so once per process (a
warning naming the install command: a user who runs ``tensorboard --logdir runs`` and finds no
event files must not be left guessing); asking for a missing backend by name raises
:class:`MissingExtra`, one line naming the install command.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable, Mapping
from pathlib import Path

from fed_ros.core.extras import INSTALL_COMMANDS, MissingExtra
from fed_ros.core.tracking import TRACKING_KINDS, Tracker, finite_items

# "auto" without a backend warns once per process: a robot or server opens one tracker, but
# `fed-ros bench federation` opens one per cell and would repeat the line for every cell.
_auto_off_warned = False


class TrackingOff(UserWarning):
    """``tracking: auto`` found no TensorBoard: nothing is tracked in this process."""


def _warn_auto_off(err: MissingExtra, warn: Callable[[str], None] | None) -> None:
    global _auto_off_warned
    if _auto_off_warned:
        return
    _auto_off_warned = True
    message = (
        f"tracking off: tracking 'auto' found no TensorBoard, so no event files are written. "
        f"{err} (a checkout's `make setup` installs it)"
    )
    if warn is None:
        warnings.warn(message, TrackingOff, stacklevel=3)
    else:
        warn(message)


class TensorBoardTracker(Tracker):
    """Event files in ``logdir`` (torch.utils.tensorboard's SummaryWriter)."""

    kind = "tensorboard"

    def __init__(self, logdir: Path | str) -> None:
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError:
            raise MissingExtra(
                "TensorBoard tracking needs the tensorboard package: "
                + INSTALL_COMMANDS["tracking"]
            ) from None
        self.location = str(logdir)
        Path(logdir).mkdir(parents=True, exist_ok=True)
        self._writer = SummaryWriter(log_dir=str(logdir), flush_secs=10)

    def scalars(self, values: Mapping[str, float], step: int) -> None:
        for tag, number in finite_items(values):
            self._writer.add_scalar(tag, number, global_step=int(step))

    def flush(self) -> None:
        self._writer.flush()

    def close(self) -> None:
        self._writer.close()


class MLflowTracker(Tracker):
    """One MLflow run (``tracking_uri``: a server, or a local ``file:`` store by default)."""

    kind = "mlflow"

    def __init__(self, run_name: str, logdir: Path | str, tracking_uri: str = "") -> None:
        try:
            import mlflow
        except ImportError:
            raise MissingExtra(
                "MLflow tracking needs mlflow: " + INSTALL_COMMANDS["mlflow"]
            ) from None
        self._mlflow = mlflow
        uri = tracking_uri or Path(logdir).resolve().as_uri()
        if not tracking_uri:
            # The local file store needs no database or server (MLflow 3 keeps it, in
            # maintenance mode, behind this opt-in); point tracking_uri at a server otherwise.
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        self.location = uri
        self._client = mlflow.tracking.MlflowClient(tracking_uri=uri)
        experiment = self._client.get_experiment_by_name("fed_ros")
        exp_id = (
            experiment.experiment_id
            if experiment is not None
            else self._client.create_experiment("fed_ros")
        )
        self._run_id = self._client.create_run(exp_id, run_name=run_name).info.run_id

    def scalars(self, values: Mapping[str, float], step: int) -> None:
        for tag, number in finite_items(values):
            # MLflow metric names allow '/', '.', '_', '-', ' ' and alphanumerics.
            self._client.log_metric(self._run_id, tag, number, step=int(step))

    def close(self) -> None:
        self._client.set_terminated(self._run_id)


def open_tracker(
    kind: str,
    logdir: Path | str,
    run_name: str = "",
    tracking_uri: str = "",
    warn: Callable[[str], None] | None = None,
) -> Tracker:
    """The tracker for ``kind`` (see TRACKING_KINDS); ``auto`` is TensorBoard when installed,
    else none, said once per process through ``warn`` (default: a :class:`TrackingOff`
    warning). ValueError names an unknown kind; MissingExtra a backend that is not installed."""
    if kind not in TRACKING_KINDS:
        raise ValueError(f"unknown tracking {kind!r}; expected one of {list(TRACKING_KINDS)}")
    if kind == "none":
        return Tracker()
    if kind == "auto":
        try:
            return TensorBoardTracker(logdir)
        except MissingExtra as err:
            _warn_auto_off(err, warn)
            return Tracker()
    if kind == "tensorboard":
        return TensorBoardTracker(logdir)
    return MLflowTracker(run_name or Path(logdir).name, logdir, tracking_uri)


def open_tracker_or_warn(
    kind: str, logdir: Path | str, run_name: str, warn: Callable[[str], None]
) -> Tracker:
    """`open_tracker` for a node: a missing backend (asked for by name, or none found by
    ``auto``) is one warning line naming the install command and no tracking, never a failed
    start of a robot or a server."""
    try:
        return open_tracker(kind, logdir, run_name, warn=warn)
    except MissingExtra as err:
        warn(f"tracking off: {err}")
        return Tracker()
