"""Shared fixtures. ROS tests: loopback discovery, a random domain id per test, and every
process started is reaped."""
from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
from pathlib import Path

import pytest

os.environ.setdefault("MUJOCO_GL", "egl")
os.environ.setdefault("PYOPENGL_PLATFORM", "egl")

REPO_ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def ros_env(monkeypatch) -> dict[str, str]:
    """Environment for ROS processes of one test: LOCALHOST discovery and a fresh domain id.

    Also applied to this process, so in-process rclpy contexts join the same domain.
    """
    domain = str(random.SystemRandom().randint(1, 101))
    monkeypatch.setenv("ROS_AUTOMATIC_DISCOVERY_RANGE", "LOCALHOST")
    monkeypatch.setenv("ROS_DOMAIN_ID", domain)
    monkeypatch.delenv("ROS_LOCALHOST_ONLY", raising=False)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), env.get("PYTHONPATH", "")) if p)
    env["PYTHONUNBUFFERED"] = "1"
    return env


class ProcessGroup:
    """Starts processes in their own session and always kills them (SIGINT, then SIGKILL)."""

    def __init__(self) -> None:
        self.procs: list[subprocess.Popen] = []

    def start(self, args: list[str], env: dict[str, str], log_path: Path | None = None,
              **kwargs) -> subprocess.Popen:
        out = open(log_path, "wb") if log_path else subprocess.DEVNULL
        proc = subprocess.Popen(args, env=env, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True, **kwargs)
        self.procs.append(proc)
        return proc

    def python(self, code_or_module: list[str], env: dict[str, str], **kwargs) -> subprocess.Popen:
        return self.start([sys.executable, *code_or_module], env, **kwargs)

    def kill_all(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                try:
                    os.killpg(proc.pid, signal.SIGINT)
                except ProcessLookupError:
                    pass
        for proc in self.procs:
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                proc.wait(timeout=5)


@pytest.fixture
def processes():
    """A ProcessGroup reaped at the end of the test, whatever happens."""
    group = ProcessGroup()
    try:
        yield group
    finally:
        group.kill_all()


@pytest.fixture(scope="module")
def torch_one_thread():
    """One intra-op torch thread for a module: threads thrash on a loaded 2-core machine
    and the test models are tiny anyway."""
    import torch  # imported here so ROS-only test runs never pay for torch

    old = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(old)
