"""`fed-ros status` across hosts: the latest round report, metadata only, a discovery range.

A stand-in server publishes what the real one latches (announcement, a history of round
reports, a cluster model) and `fed-ros status` runs as its own process against it.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time

import pytest

from conftest import default_sigint

from fed_ros.ros.fleet.cli import status_discovery_range


def test_discovery_range_option_then_recorded_then_environment():
    assert status_discovery_range("SUBNET", "LOCALHOST", "LOCALHOST") == "SUBNET"
    assert status_discovery_range(None, "SUBNET", "LOCALHOST") == "SUBNET"
    assert status_discovery_range(None, None, "SYSTEM_DEFAULT") == "SYSTEM_DEFAULT"
    assert status_discovery_range(None, None, None) == "LOCALHOST"


@pytest.mark.timeout(300)
def test_status_shows_the_latest_report_and_pulls_no_models(tmp_path, ros_env):
    import rclpy
    from fed_ros.msg import ClusterModel, RoundAnnouncement, RoundReport
    from fed_ros.ros.nodes.server.server_node import REPORT_HISTORY
    from fed_ros.ros.wire import qos

    context = rclpy.Context()
    rclpy.init(context=context)
    node = rclpy.create_node("fake_server", namespace="/fleet", context=context)
    status = None
    try:
        ann_pub = node.create_publisher(RoundAnnouncement, "round", qos.latched_qos())
        report_pub = node.create_publisher(
            RoundReport, "round_report", qos.model_state_qos(REPORT_HISTORY)
        )
        model_pub = node.create_publisher(ClusterModel, "cluster_models", qos.model_state_qos(64))
        ann_pub.publish(
            RoundAnnouncement(round=3, algorithm="fedavg", participants=["robot_0"], quorum=1)
        )
        for r in range(3):
            report_pub.publish(
                RoundReport(round=r, algorithm="fedavg", completed=True, status=f"completed-{r}")
            )
        model = ClusterModel(cluster_id=0, round=3)
        model.payload.payload_id, model.payload.sha256 = "m", "0" * 64
        model_pub.publish(model)

        # The state file `fed-ros up` writes: status takes the domain and range from it.
        fleet = tmp_path / "fleet.yaml"
        fleet.write_text(
            f"fleet:\n  name: s\n  algorithm: fedavg\n  rounds: 3\n  run_dir: {tmp_path}\n  "
            f"robots:\n    - {{id: robot_0, task: lift}}\n"
        )
        (tmp_path / "fleet.json").write_text(
            json.dumps({"domain_id": int(ros_env["ROS_DOMAIN_ID"]), "discovery_range": "LOCALHOST"})
        )
        env = {
            k: v
            for k, v in ros_env.items()
            if k not in ("ROS_DOMAIN_ID", "ROS_AUTOMATIC_DISCOVERY_RANGE")
        }
        out_path, err_path = tmp_path / "status.out", tmp_path / "status.err"
        with open(out_path, "w") as out_file, open(err_path, "w") as err_file:
            status = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "fed_ros.cli",
                    "status",
                    str(fleet),
                    "--watch",
                    "--timeout",
                    "30",
                ],
                env=env,
                stdout=out_file,
                stderr=err_file,
                start_new_session=True,
                preexec_fn=default_sigint,
            )
        # While it watches: it reads the reports, and nothing subscribes to the models.
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and node.count_subscribers("/fleet/round_report") == 0:
            assert status.poll() is None, err_path.read_text()
            time.sleep(0.1)
        assert node.count_subscribers("/fleet/round_report") == 1
        time.sleep(
            0.5
        )  # (not a wait for a condition: a window in which a model subscription could show)
        assert node.count_subscribers("/fleet/cluster_models") == 0
        assert model_pub.get_subscription_count() == 0
        # The summary prints once the latched history drained; then Ctrl-C ends --watch.
        # (a liveness deadline: on a loaded machine the latched history takes a while to drain;
        # Ctrl-C is sent only once the command is in its watch loop, not while it starts up)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and "last round report" not in out_path.read_text():
            assert status.poll() is None, err_path.read_text()
            time.sleep(0.1)
        assert "last round report" in out_path.read_text(), (
            out_path.read_text(),
            err_path.read_text(),
        )
        os.kill(status.pid, signal.SIGINT)
        status.wait(timeout=20)
        out, err = out_path.read_text(), err_path.read_text()
    finally:
        if status is not None and status.poll() is None:
            os.killpg(status.pid, signal.SIGKILL)
            status.wait()
        node.destroy_node()
        rclpy.try_shutdown(context=context)
    assert status.returncode == 0, err
    assert "Traceback" not in err, err
    reports = re.findall(r"^round (\d+) \(fedavg\): (\S+)", out, re.M)
    assert reports == [("2", "completed-2;")], out
