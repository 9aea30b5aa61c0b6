"""Wire bytes of ROS chunks (issue 36 item 5, docs/transport.md "Wire bytes of ROS chunks").

- The socket-buffer profile (fed_ros/ros/wire/socket_buffers.py) is really taken by a ROS node:
  its UDP sockets' receive buffers, read back with ``ss``, are the profile's, not the kernel's
  default.
- ``python -m fed_ros.ros.bench.wire_overhead`` between two network-namespace hosts counts the
  robot link's bytes per update (at least the payload), the server's receive-buffer drops (none
  with the profile) and completes every update. Structure, never a speed or ratio threshold.

The namespace test is skipped (with the reason) only where namespaces cannot be made.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import wait_until
from fed_ros.ros.rigs.netns import unavailable_reason
from fed_ros.ros.wire.socket_buffers import (
    DEFAULT_BUFFER_BYTES,
    apply_buffers_profile,
    buffers_fastdds_profile,
)

NODE = """
import rclpy, sys, time
from std_msgs.msg import String
rclpy.init()
node = rclpy.create_node("buffers_probe")
node.create_subscription(String, "probe", lambda m: None, 10)
print("ready", flush=True)
end = time.monotonic() + 60
while time.monotonic() < end:
    rclpy.spin_once(node, timeout_sec=0.1)
"""


def _receive_buffers(env: dict[str, str], processes, log: Path) -> list[int]:
    """The ``rb`` of every UDP socket of a ROS node started with ``env``."""
    proc = processes.start([sys.executable, "-c", NODE], env=env, log_path=log)
    wait_until(lambda: "ready" in log.read_text(), 60, "the probe node", diagnostics=log.read_text)
    time.sleep(1.0)  # its transports are open once the node exists; discovery is not needed
    out = subprocess.run(
        ["ss", "-u", "-a", "-m", "-n", "-p"], capture_output=True, text=True, check=True
    ).stdout
    lines = out.splitlines()
    found = []
    for i, line in enumerate(lines):
        if f"pid={proc.pid}," in line:
            block = " ".join(lines[i : i + 2])  # skmem is on the socket's line or the next
            m = re.search(r"skmem:\(r\d+,rb(\d+),", block)
            if m:
                found.append(int(m.group(1)))
    proc.kill()
    proc.wait()
    assert found, f"no UDP socket of pid {proc.pid} in ss:\n{out[-2000:]}"
    return found


@pytest.mark.ros
@pytest.mark.skipif(shutil.which("ss") is None, reason="needs ss (iproute2)")
def test_a_ros_node_takes_the_socket_buffer_profile(ros_env, processes, tmp_path):
    default = _receive_buffers(ros_env, processes, tmp_path / "default.log")
    env = dict(ros_env)
    apply_buffers_profile(env, tmp_path)
    tuned = _receive_buffers(env, processes, tmp_path / "tuned.log")
    # Linux doubles a requested SO_RCVBUF (bookkeeping), capped by net.core.rmem_max.
    cap = 2 * int(Path("/proc/sys/net/core/rmem_max").read_text())
    assert max(tuned) >= min(2 * DEFAULT_BUFFER_BYTES, cap), (default, tuned)
    assert max(default) < max(tuned), (default, tuned)


def test_the_profile_refuses_a_buffer_below_one_datagram():
    with pytest.raises(ValueError, match="got 1000"):
        buffers_fastdds_profile(1000)
    assert "<receiveBufferSize>4194304</receiveBufferSize>" in buffers_fastdds_profile()


@pytest.mark.ros
@pytest.mark.timeout(300)
def test_wire_overhead_counts_link_bytes_and_receive_drops(ros_env, tmp_path, capsys):
    reason = unavailable_reason()
    if reason:
        pytest.skip(f"separate hosts need network namespaces: {reason}")
    from fed_ros.ros.bench.wire_overhead import main, summary

    out = tmp_path / "wire.json"
    argv = ["--updates", "2", "--busy", "0", "--encodings", "int8_delta,float32"]
    assert main([*argv, "--buffers", str(DEFAULT_BUFFER_BYTES), "--json", str(out)]) == 0
    found = json.loads(out.read_text())
    assert [m["encoding"] for m in found] == ["int8_delta", "float32"]
    for m in found:
        assert m["server"]["completed"] == 2, m
        for row in m["rows"]:
            assert row["sends"] >= 1 and row["ack_s"] is not None, row
            # The robot's link carried at least the payload: the counters are the link's.
            assert row["tx_bytes"] >= row["payload_bytes"] > 0, row
        assert summary(m)["rcvbuf_drops"] == 0, m["server"]  # 4 MiB holds a whole update
    assert found[1]["rows"][0]["payload_bytes"] > 3 * found[0]["rows"][0]["payload_bytes"]
    printed = capsys.readouterr().out
    assert "tx/payload" in printed and "float32" in printed and "int8_delta" in printed
