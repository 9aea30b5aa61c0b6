"""colcon on a ROS 2 layout: build a copy of the package with the venv as underlay (what a
lab machine with a full ROS 2 install does with its /opt/ros underlay) and use the result.

Checks: `colcon build` succeeds; with only the install's environment, `fed_ros.msg`,
`fed_ros.srv` and `fed_ros.core` import from the install; node executables are in
lib/fed_ros (`ros2 run fed_ros <node>`); launch/ and config/ are in share/fed_ros.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
VENV = Path(sys.prefix)
PACKAGE_PATHS = (
    "package.xml",
    "CMakeLists.txt",
    "cmake",
    "msg",
    "srv",
    "fed_ros",
    "scripts",
    "launch",
    "config",
)

pytestmark = pytest.mark.slow


def _tracked_files() -> list[str]:
    """The package's tracked files (what a clone has); falls back to a directory walk."""
    try:
        out = subprocess.run(
            ["git", "ls-files", "--", *PACKAGE_PATHS],
            cwd=REPO,
            check=True,
            capture_output=True,
            text=True,
        ).stdout.split()
        if out:
            return [f for f in out if (REPO / f).is_file()]
    except (OSError, subprocess.CalledProcessError):
        pass
    files = []
    for path in PACKAGE_PATHS:
        p = REPO / path
        if p.is_file():
            files.append(path)
        elif p.is_dir():
            files += [
                str(f.relative_to(REPO))
                for f in p.rglob("*")
                if f.is_file() and "__pycache__" not in f.parts
            ]
    return files


def _scripts() -> list[str]:
    return sorted(Path(f).name for f in _tracked_files() if f.startswith("scripts/"))


def test_colcon_build_and_import(tmp_path: Path) -> None:
    if shutil.which("colcon", path=str(VENV / "bin")) is None:
        pytest.fail(
            "colcon is not installed in the venv (requirements.txt: colcon-common-extensions)"
        )
    src = tmp_path / "ws" / "src" / "fed_ros"
    for rel in _tracked_files():
        dest = src / rel
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO / rel, dest)
    ws = tmp_path / "ws"
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("PYTHONPATH", "AMENT_PREFIX_PATH", "CMAKE_PREFIX_PATH")
    }
    env.update(
        {
            "VIRTUAL_ENV": str(VENV),
            "PATH": f"{VENV / 'bin'}{os.pathsep}{env.get('PATH', '')}",
            "AMENT_PREFIX_PATH": str(VENV),
            "CMAKE_PREFIX_PATH": str(VENV),
            "MAKEFLAGS": "-j2",
        }
    )
    t0 = time.monotonic()
    build = subprocess.run(
        [
            str(VENV / "bin" / "colcon"),
            "--log-base",
            str(ws / "log"),
            "build",
            "--base-paths",
            str(ws / "src"),
            "--build-base",
            str(ws / "build"),
            "--install-base",
            str(ws / "install"),
            "--cmake-args",
            f"-DCMAKE_PROJECT_INCLUDE={REPO / 'cmake' / 'strip_opt_python_includes.cmake'}",
            f"-DPython3_EXECUTABLE={VENV / 'bin' / 'python'}",
            "-DBUILD_TESTING=OFF",
        ],
        cwd=ws,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    build_s = time.monotonic() - t0
    logs = "\n".join(
        p.read_text(errors="replace")[-3000:] for p in (ws / "log").rglob("stderr.log")
    )
    assert build.returncode == 0, (
        f"colcon build failed:\n{build.stdout[-3000:]}\n{build.stderr[-3000:]}\n{logs}"
    )

    prefix = ws / "install" / "fed_ros"
    site = next(prefix.glob("lib/python3*/site-packages"))
    # Only the install (plus the venv underlay); cwd outside the repo so the source tree is not
    # importable by accident.
    run_env = {k: v for k, v in env.items() if k not in ("PYTHONPATH",)}
    run_env.update(
        {
            "PYTHONPATH": str(site),
            "AMENT_PREFIX_PATH": f"{prefix}{os.pathsep}{VENV}",
            "LD_LIBRARY_PATH": f"{prefix / 'lib'}{os.pathsep}"
            f"{os.environ.get('LD_LIBRARY_PATH', '')}",
        }
    )
    code = (
        "import fed_ros, fed_ros.msg, fed_ros.srv, fed_ros.core.params as p\n"
        "from fed_ros.msg import ModelUpdate, TensorPayload\n"
        "from fed_ros.srv import Register\n"
        "from rclpy.serialization import serialize_message\n"
        "assert len(serialize_message(ModelUpdate(robot_id='r'))) > 0\n"
        "print(fed_ros.msg.__file__); print(p.__file__)\n"
    )
    probe = subprocess.run(
        [sys.executable, "-c", code],
        cwd=tmp_path,
        env=run_env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert probe.returncode == 0, probe.stderr[-3000:]
    msg_file, core_file = probe.stdout.split()
    assert Path(msg_file).is_relative_to(site), (
        f"fed_ros.msg imported from {msg_file}, not the install"
    )
    assert Path(core_file).is_relative_to(site), (
        f"fed_ros.core imported from {core_file}, not the install"
    )

    scripts = _scripts()
    assert scripts, "no node scripts tracked under scripts/"
    for name in scripts:
        exe = prefix / "lib" / "fed_ros" / name
        assert exe.is_file() and os.access(exe, os.X_OK), f"{exe} missing or not executable"
    share = prefix / "share" / "fed_ros"
    assert (share / "launch").is_dir() and (share / "config").is_dir()
    assert (share / "config" / "fastdds_shm.xml").is_file()
    tracked_launch = [Path(f).name for f in _tracked_files() if f.startswith("launch/")]
    assert sorted(p.name for p in (share / "launch").iterdir()) == sorted(tracked_launch)
    assert (share / "package.xml").is_file()
    print(
        f"\n[colcon] build {build_s:.1f} s, {len(scripts)} node executables, {len(tracked_launch)} "
        "launch files"
    )
