"""`fed-ros status --web` in a real headless browser (Chromium from Debian packages) against a
real fleet over DDS: the page the browser renders names every robot, its cluster, its accepted
updates and each completed round, and the screenshot shows it (``fleet_status.png`` in the
test's directory; docs/img/fleet_status.png was taken this way)."""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from conftest import wait_until

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
pytestmark = pytest.mark.skipif(
    CHROMIUM is None,
    reason="Chromium not installed (make test installs Debian's chromium when run as root)",
)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _chromium(*args: str) -> subprocess.CompletedProcess:
    # --no-sandbox: the sandbox refuses to run as root (CI); the page is our own.
    argv = [CHROMIUM, "--headless=new", "--no-sandbox", "--disable-gpu", "--hide-scrollbars"]
    argv += ["--window-size=1100,760", "--virtual-time-budget=4000", *args]
    return subprocess.run(argv, capture_output=True, timeout=120, text=True)


@pytest.mark.timeout(300)
def test_live_fleet_view_renders_the_fleet_in_chromium(tmp_path, ros_env, processes):
    from fed_ros.learning.dataset import synthetic_episodes
    from fed_ros.ros.fleet.fleet_file import fleet_config_from_dict
    from fed_ros.ros.fleet.launcher import build_commands, fleet_env
    from fed_ros.ros.fleet.plan import plan_fleet

    robots = ("robot_0", "robot_1")
    config = fleet_config_from_dict(
        {
            "fleet": {
                "name": "web",
                "algorithm": "fedavg",
                "rounds": 2,
                "run_dir": str(tmp_path),
                "server": {"round_timeout_s": 120.0, "tracking": "none"},
                "robot_defaults": {
                    "train_max_steps": 2,
                    "torch_threads": 1,
                    "trainer.val_fraction": 0.0,
                    "tracking": "none",
                },
                "robots": [{"id": r, "task": "lift", "sim": False} for r in robots],
            }
        }
    )
    for k, rid in enumerate(robots):
        (tmp_path / rid / "demos").mkdir(parents=True)
        for j, episode in enumerate(synthetic_episodes(2, length=20, seed=k)):
            episode.save(tmp_path / rid / "demos" / f"synthetic_{j}.npz")
    env = fleet_env(base=ros_env)
    for c in build_commands(plan_fleet(config, include_server=True), tmp_path):
        if c.spec.executable != "arm_adapter_node":
            processes.start(c.argv, env, log_path=c.log_path)
    port = _free_port()
    fed_ros = str(Path(sys.executable).parent / "fed-ros")
    web_log = tmp_path / "status_web.log"
    web = processes.start([fed_ros, "status", "--web", str(port)], env, log_path=web_log)
    url = f"http://127.0.0.1:{port}/"

    def finished() -> bool:
        try:
            snap = json.loads(urllib.request.urlopen(url + "status.json", timeout=5).read())
        except OSError:
            return False
        return snap["stage"] == "done" and len(snap["timeline"]) == 2

    wait_until(
        finished,
        240,
        "the web view to show both rounds and the end",
        interval=0.5,
        diagnostics=lambda: f"fed-ros status exit {web.poll()}: " + web_log.read_text()[-2000:],
    )
    dom = _chromium("--dump-dom", url)
    assert dom.returncode == 0, dom.stderr[-2000:]
    html = dom.stdout
    for rid in robots:
        assert f"<td>{rid}</td>" in html, html[-3000:]
    assert html.count('<span class="ok">accepted</span>') == 2  # each robot's last update
    assert html.count('<span class="ok">completed</span>') == 2  # the timeline's rounds
    assert "stage <b>done</b>" in html and "<td>robot_0, robot_1</td>" in html  # one cluster
    shot = tmp_path / "fleet_status.png"
    res = _chromium(f"--screenshot={shot}", url)
    assert res.returncode == 0 and shot.is_file(), res.stderr[-2000:]
    from PIL import Image

    with Image.open(shot) as img:
        assert img.size == (1100, 760)
        gray = img.convert("L")
        dark = sum(1 for v in gray.getdata() if v < 100)  # text and the success bars
    assert dark > 2000, f"the screenshot is nearly blank ({dark} dark pixels)"
