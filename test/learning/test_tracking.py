"""Experiment tracking (fed_ros.core.tracking, fed_ros.learning.tracking): scalars written to
TensorBoard event files and to an MLflow file store, read back with each tool's own reader; a
missing backend is one line naming the install command; a round's outcome as scalars."""

from __future__ import annotations

import math
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from fed_ros.core.rounds.report import RobotOutcome, RoundOutcome
from fed_ros.core.rounds.round_scalars import outcome_scalars
from fed_ros.core.extras import MissingExtra
from fed_ros.core.tracking import Tracker
from fed_ros.learning.tracking import open_tracker, open_tracker_or_warn
from support.tb_events import read_scalars


def test_tensorboard_event_files_hold_every_finite_scalar_at_its_step(tmp_path):
    tracker = open_tracker("tensorboard", tmp_path / "tb")
    tracker.scalars({"train/bc": 1.5, "train/total": 2.0, "eval/success": math.nan}, 1)
    tracker.scalars({"train/bc": 1.25, "note": "text"}, 2)
    tracker.close()
    scalars = read_scalars(tmp_path / "tb")
    assert scalars == {"train/bc": [(1, 1.5), (2, 1.25)], "train/total": [(1, 2.0)]}
    assert open_tracker("auto", tmp_path / "auto").kind == "tensorboard"  # installed here


def test_mlflow_run_holds_the_metrics(tmp_path):
    tracker = open_tracker("mlflow", tmp_path / "mlruns", run_name="robot_0")
    tracker.scalars({"train/bc": 0.75, "skip": math.inf}, 3)
    tracker.close()
    import mlflow

    client = mlflow.tracking.MlflowClient(tracking_uri=tracker.location)
    (run,) = client.search_runs([client.get_experiment_by_name("fed_ros").experiment_id])
    assert run.info.run_name == "robot_0" and run.info.status == "FINISHED"
    history = client.get_metric_history(run.info.run_id, "train/bc")
    assert [(m.step, m.value) for m in history] == [(3, 0.75)]
    assert "skip" not in run.data.metrics


def test_unknown_kind_and_none(tmp_path):
    with pytest.raises(ValueError, match="unknown tracking 'wandb'"):
        open_tracker("wandb", tmp_path)
    tracker = open_tracker("none", tmp_path / "none")
    tracker.scalars({"a": 1.0}, 0)
    tracker.close()
    assert type(tracker) is Tracker and not (tmp_path / "none").exists()


def test_a_missing_backend_is_one_line_naming_the_install_command(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", None)  # import fails
    with pytest.raises(MissingExtra) as err:
        open_tracker("tensorboard", tmp_path)
    assert str(err.value) == (
        "TensorBoard tracking needs the tensorboard package: "
        "pip install 'fed_ros[tracking]' (or: pip install tensorboard)"
    )
    warned: list[str] = []
    tracker = open_tracker_or_warn("tensorboard", tmp_path, "server", warned.append)
    assert type(tracker) is Tracker and warned == [f"tracking off: {err.value}"]


# Run first in a fresh interpreter: TensorBoard is not installed there, as after a bare
# `pip install fed_ros` (an import finder refuses it; our own code runs unchanged).
_WITHOUT_TENSORBOARD = textwrap.dedent(
    """
    import sys

    class NoTensorBoard:
        def find_spec(self, name, path=None, target=None):
            for blocked in ("tensorboard", "torch.utils.tensorboard"):
                if name == blocked or name.startswith(blocked + "."):
                    raise ModuleNotFoundError(f"No module named {name!r}", name=name)
            return None

    sys.meta_path.insert(0, NoTensorBoard())
    """
)


def _run_without_tensorboard(code: str, cwd) -> subprocess.CompletedProcess:
    repo = str(Path(__file__).resolve().parents[2])
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([repo, *sys.path]))
    return subprocess.run(
        [sys.executable, "-c", _WITHOUT_TENSORBOARD + textwrap.dedent(code)],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_auto_without_tensorboard_says_so_once_naming_the_install_command(tmp_path):
    done = _run_without_tensorboard(
        """
        from fed_ros.learning.tracking import open_tracker
        for run in ("server", "robot_0", "robot_1"):
            tracker = open_tracker("auto", f"tb/{run}")
            tracker.scalars({"loss": 1.0}, 0)
            tracker.close()
            print("kind", tracker.kind)
        """,
        tmp_path,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["kind", "none"] * 3
    assert done.stderr.count("tracking off") == 1, done.stderr
    assert "tracking 'auto' found no TensorBoard, so no event files are written" in done.stderr
    assert "pip install 'fed_ros[tracking]'" in done.stderr
    assert not (tmp_path / "tb").exists()


def test_a_node_hears_of_auto_without_tensorboard_in_its_own_log_once(tmp_path):
    done = _run_without_tensorboard(
        """
        from fed_ros.learning.tracking import open_tracker_or_warn
        warned = []
        for run in ("server", "robot_0"):
            open_tracker_or_warn("auto", f"tb/{run}", run, warned.append)
        print(repr(warned))
        """,
        tmp_path,
    )
    assert done.returncode == 0, done.stderr
    (line,) = eval(done.stdout)
    assert line.startswith("tracking off: tracking 'auto' found no TensorBoard")
    assert "pip install 'fed_ros[tracking]' (or: pip install tensorboard)" in line
    assert "tracking off" not in done.stderr  # the node's logger said it, not a stray warning


def test_a_round_outcome_as_scalars():
    outcome = RoundOutcome(
        round_idx=4,
        algorithm="feddrman",
        completed=True,
        status="completed",
        updates_received=3,
        updates_accepted=2,
        updates_rejected=1,
        aggregation_seconds=0.5,
        robots=[
            RobotOutcome("robot_0", [0], 7, train_loss=1.0, success_rate=0.5, accepted=True),
            RobotOutcome("robot_1", [1], 7, train_loss=2.0, success_rate=1.0, accepted=True),
            RobotOutcome("robot_2", [1], 0, accepted=False, reason="late"),
        ],
        clusters={0: ["robot_0"], 1: ["robot_1", "robot_2"]},
        cluster_update_norms={0: 0.25},
        diagnostics={"num_clusters": 2.0},
    )
    s = outcome_scalars(outcome, update_bytes=1000)
    assert s["round/updates_accepted"] == 2.0 and s["round/updates_rejected"] == 1.0
    assert s["round/update_bytes"] == 1000.0 and s["round/completed"] == 1.0
    assert s["clusters/count"] == 2.0 and s["clusters/1/members"] == 2.0
    assert s["clusters/0/update_norm"] == 0.25 and s["strategy/num_clusters"] == 2.0
    assert s["robots/robot_1/success"] == 1.0 and s["robots/robot_2/accepted"] == 0.0
    assert s["success/mean"] == 0.75  # robot_2 did not evaluate: not in the mean
    assert math.isnan(s["robots/robot_2/success"])


def test_progress_text_gives_the_eta_at_the_pace_so_far():
    from fed_ros.core.progress import eta_seconds, progress_text

    assert progress_text(100, 400, 50.0) == "step 100 of 400, about 150 s left"
    assert progress_text(0, 400, 0.0) == "step 0 of 400"  # no pace yet
    assert progress_text(7, 0, 3.0) == "step 7"  # total unknown
    assert eta_seconds(400, 400, 80.0) == 0.0 and eta_seconds(5, 4, 1.0) == 0.0
