"""shutdown.node_main / exit_process: the exit code survives, nothing written is lost by os._exit
(no ROS)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

SCRIPT = textwrap.dedent("""
    import sys
    from fed_ros.ros import shutdown

    @shutdown.node_main
    def main(how):
        print("buffered stdout", end="")  # stdout is a pipe: block-buffered
        sys.stderr.write("stderr line\\\\n")
        if how == "raise":
            raise RuntimeError("boom")
        if how == "none":
            return None
        return int(how)

    main(sys.argv[1])
    print("after main")  # never runs: node_main ends the process
""")


@pytest.mark.parametrize("how, code", [("0", 0), ("3", 3), ("none", 0), ("raise", 1)])
def test_node_main_exits_with_mains_code_and_flushes_stdio(how, code):
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT, how], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == code, proc.stderr
    assert proc.stdout == "buffered stdout"
    assert "stderr line" in proc.stderr
    assert ("RuntimeError: boom" in proc.stderr) == (how == "raise")


def test_unless_stopping_drops_calls_once_shutdown_is_requested():
    proc = subprocess.run(
        [
            sys.executable,
            "-c",
            textwrap.dedent("""
        from fed_ros.ros import shutdown
        seen = []
        log = shutdown.unless_stopping(seen.append)
        log("before")
        shutdown.request()
        log("after")
        print(seen)
    """),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.stdout.strip() == "['before']", proc.stderr
