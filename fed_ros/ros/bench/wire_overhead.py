"""Link bytes of a robot's update sent as ROS chunks, against its payload (issue 36 item 5).

``python -m fed_ros.ros.bench.wire_overhead`` (root): a server host and a robot host, each a
network namespace with its own /dev/shm (fed_ros/ros/rigs/netns.py), so Fast DDS really uses
UDP between them. The robot sends ``--updates`` updates of a real policy (its initial model plus
noise, encoded as a robot encodes it: ``float32``, ``int8_delta``, ...) as fed_ros ModelUpdate
chunks with the fleet's QoS, and re-sends a whole update that the server has not acknowledged
after ``--retry-s`` (the robot's ``update_retry_s``: 2 s, doubling, at most 10 s), as
``nodes.robot.uplink.UpdateUplink`` does. The server assembles the chunks, checks the sha256 and
acknowledges once per completed send, as the fleet server does.

Per update the robot reads its own link's counters (``/sys/class/net/eth0/statistics`` inside
its namespace) from just before the first send until ``--settle-s`` after the acknowledgement,
so DDS's repairs of that update are counted; the server reads its UDP receive-buffer drops
(``RcvbufErrors`` in ``/proc/net/snmp``). ``--busy N`` runs N busy loops beside the hosts while
a load level is measured (the shared 2-core machine's load comes on top); ``--buffers B`` loads
the socket-buffer profile of :mod:`fed_ros.ros.wire.socket_buffers` on both hosts, ``paced``
the paced profile of :mod:`fed_ros.ros.wire.pacing` for the ``--rate`` link (a comma list is
measured in turn at each load level, so the rows share the machine's load).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

LINK = Path("/sys/class/net/eth0/statistics")
READY_TIMEOUT_S = 30.0


def link_counters() -> dict[str, int]:
    """This namespace's eth0 byte and packet counters."""
    return {
        name: int((LINK / name).read_text())
        for name in ("tx_bytes", "tx_packets", "rx_bytes", "rx_packets")
    }


def udp_counters() -> dict[str, int]:
    """This namespace's UDP counters (``/proc/net/snmp``): datagrams in, buffer drops, errors."""
    lines = [ln.split() for ln in Path("/proc/net/snmp").read_text().splitlines() if ln]
    udp = [ln for ln in lines if ln[0] == "Udp:"]
    out = dict(zip(udp[0][1:], map(int, udp[1][1:])))
    ip = [ln for ln in lines if ln[0] == "Ip:"]
    ip_counts = dict(zip(ip[0][1:], map(int, ip[1][1:])))
    return {
        "InDatagrams": out["InDatagrams"],
        "RcvbufErrors": out["RcvbufErrors"],
        "InErrors": out["InErrors"],
        "ReasmFails": ip_counts["ReasmFails"],
    }


def _emit(obj: dict[str, Any]) -> None:
    print("RESULT " + json.dumps(obj), flush=True)


def _sender(args: argparse.Namespace) -> None:
    import rclpy
    from std_msgs.msg import String

    from fed_ros.core.rounds.delivery import RetrySchedule
    from fed_ros.msg import ModelUpdate
    from fed_ros.ros.bench.transfer_encodings import encode_update, noisy_update
    from fed_ros.ros.wire.chunk_sender import ChunkedSender
    from fed_ros.ros.wire.qos import control_qos
    from fed_ros.ros.wire.round_msgs import model_update_msg

    payload = encode_update(*noisy_update(args.policy), args.encoding)
    retry = RetrySchedule(first_s=args.retry_s, max_s=max(10.0, args.retry_s))
    rclpy.init()
    node = rclpy.create_node("wire_robot")
    pub = node.create_publisher(ModelUpdate, "bench/updates", control_qos())
    acks: list[str] = []
    node.create_subscription(
        String, "bench/acks", lambda m: acks.append(json.loads(m.data)["pid"]), control_qos()
    )
    deadline = time.monotonic() + READY_TIMEOUT_S
    while (
        pub.get_subscription_count() < 1 or node.count_publishers("bench/acks") < 1
    ) and time.monotonic() < deadline:
        rclpy.spin_once(node, timeout_sec=0.05)
    time.sleep(1.0)  # discovery settles in both directions before anything is counted
    rows = []
    for i in range(args.updates):
        pid = f"wire/{i}"
        chunks = ChunkedSender(payload, pid).chunks()
        msgs = [
            model_update_msg(c, robot_id="wire_robot", round_idx=i, base_round=i) for c in chunks
        ]
        before = link_counters()
        t0 = time.monotonic()
        sends, next_due = 0, t0
        while pid not in acks and time.monotonic() < t0 + args.transfer_timeout:
            if args.retry_s > 0 or sends == 0:
                if time.monotonic() >= next_due:
                    for msg in msgs:
                        pub.publish(msg)
                    sends += 1
                    next_due = time.monotonic() + retry.delay(sends)
            rclpy.spin_once(node, timeout_sec=0.01)
        ack_s = time.monotonic() - t0 if pid in acks else None
        settle = time.monotonic() + args.settle_s
        while time.monotonic() < settle:
            rclpy.spin_once(node, timeout_sec=0.05)
        after = link_counters()
        rows.append(
            {
                "payload_bytes": int(payload.total_bytes),
                "sends": sends,
                "ack_s": ack_s,
                **{k: after[k] - before[k] for k in after},
            }
        )
    _emit({"rows": rows})
    node.destroy_node()
    rclpy.shutdown()


def _receiver(args: argparse.Namespace) -> None:
    import rclpy
    from std_msgs.msg import String

    from fed_ros.msg import ModelUpdate
    from fed_ros.ros.wire.chunk_assembler import PayloadAssembler, TransferLimits
    from fed_ros.ros.wire.qos import control_qos

    rclpy.init()
    node = rclpy.create_node("wire_server")
    ack = node.create_publisher(String, "bench/acks", control_qos())
    assembler = PayloadAssembler(TransferLimits(max_total_bytes=1 << 30, max_chunk_bytes=1 << 30))
    done: set[str] = set()
    chunk_deliveries = 0
    before = udp_counters()

    def on_update(msg: ModelUpdate) -> None:
        nonlocal chunk_deliveries
        chunk_deliveries += 1
        pid = msg.payload.payload_id
        first = msg.payload.chunk_index == 0
        if pid in done:
            if first:  # a re-send of a completed update: acknowledged again, as the server does
                ack.publish(String(data=json.dumps({"pid": pid})))
            return
        if assembler.add(msg.payload) is not None:
            done.add(pid)
            ack.publish(String(data=json.dumps({"pid": pid})))

    node.create_subscription(ModelUpdate, "bench/updates", on_update, control_qos())
    deadline = (
        time.monotonic()
        + READY_TIMEOUT_S
        + args.updates * (args.transfer_timeout + args.settle_s + 1.0)
    )
    while len(done) < args.updates and time.monotonic() < deadline:
        rclpy.spin_once(node, timeout_sec=0.05)
    end = time.monotonic() + args.settle_s + 1.0  # the last re-sends and repairs
    while time.monotonic() < end:
        rclpy.spin_once(node, timeout_sec=0.05)
    after = udp_counters()
    _emit(
        {
            "completed": len(done),
            "chunk_deliveries": chunk_deliveries,
            **{k: after[k] - before[k] for k in after},
        }
    )
    node.destroy_node()
    rclpy.shutdown()


def _busy_loops(n: int) -> list[subprocess.Popen]:
    code = "while True: pass"
    return [subprocess.Popen([sys.executable, "-c", code]) for _ in range(n)]


def _result(out: str, who: str) -> dict[str, Any]:
    for line in out.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[7:])
    raise RuntimeError(f"the {who} printed no result:\n{out[-3000:]}")


def measure(
    net: Any, args: argparse.Namespace, encoding: str, busy: int, buffers: int | str = 0
) -> dict[str, Any]:
    """One encoding at one load level through ``net`` (hosts "server" and "robot"), with UDP
    socket buffers of ``buffers`` bytes (0: Fast DDS's defaults), or ``"paced"``: the paced
    profile for the ``args.rate`` link."""
    env = dict(os.environ, ROS_AUTOMATIC_DISCOVERY_RANGE="SUBNET")
    for key in ("ROS_LOCALHOST_ONLY", "FASTDDS_DEFAULT_PROFILES_FILE"):
        env.pop(key, None)
    env.setdefault("ROS_DOMAIN_ID", str(random.SystemRandom().randint(1, 101)))
    profile_dir = Path(tempfile.mkdtemp(prefix="fed_ros-wire-"))
    if buffers == "paced":
        from fed_ros.ros.wire.pacing import apply_paced_profile

        apply_paced_profile(env, args.rate, profile_dir)
    elif buffers:
        from fed_ros.ros.wire.socket_buffers import apply_buffers_profile

        apply_buffers_profile(env, profile_dir, int(buffers))
    common = [
        "--encoding",
        encoding,
        "--policy",
        args.policy,
        "--updates",
        str(args.updates),
        "--retry-s",
        str(args.retry_s),
        "--settle-s",
        str(args.settle_s),
        "--transfer-timeout",
        str(args.transfer_timeout),
    ]
    me = [sys.executable, "-m", "fed_ros.ros.bench.wire_overhead"]
    load = _busy_loops(busy)
    procs = []
    try:
        for host, role in (("server", "receiver"), ("robot", "sender")):
            procs.append(
                subprocess.Popen(
                    net.command(host, [*me, "--role", role, *common]),
                    env=env,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.STDOUT,
                    text=True,
                )
            )
            time.sleep(0.3)
        limit = READY_TIMEOUT_S + args.updates * (args.transfer_timeout + args.settle_s + 2) + 30
        outs = [p.communicate(timeout=limit)[0] for p in procs]
        loadavg = os.getloadavg()[0]
    finally:
        for p in [*procs, *load]:
            if p.poll() is None:
                p.kill()
                p.wait()
        shutil.rmtree(profile_dir, ignore_errors=True)
    server, robot = _result(outs[0], "server"), _result(outs[1], "robot")
    return {
        "encoding": encoding,
        "busy": busy,
        "buffers": buffers,
        "load1": loadavg,
        "server": server,
        **robot,
    }


def summary(m: dict[str, Any]) -> dict[str, Any]:
    """The printed row of one measurement: link bytes per payload byte, sends, drops."""
    rows = m["rows"]
    ratios = [r["tx_bytes"] / r["payload_bytes"] for r in rows]
    acked = [r["ack_s"] for r in rows if r["ack_s"] is not None]
    return {
        "encoding": m["encoding"],
        "busy": m["busy"],
        "buffers": m["buffers"],
        "load1": m["load1"],
        "payload_bytes": rows[0]["payload_bytes"],
        "updates": len(rows),
        "tx_over_payload_median": statistics.median(ratios),
        "tx_over_payload_min": min(ratios),
        "tx_over_payload_max": max(ratios),
        "resent_updates": sum(r["sends"] > 1 for r in rows),
        "sends_total": sum(r["sends"] for r in rows),
        "ack_s_median": statistics.median(acked) if acked else None,
        "ack_s_max": max(acked) if acked else None,
        "rcvbuf_drops": m["server"]["RcvbufErrors"],
        "reasm_fails": m["server"]["ReasmFails"],
    }


def main(argv: list[str] | None = None) -> int:
    """Measure and print link bytes / payload per encoding and load level; returns 0."""
    parser = argparse.ArgumentParser(prog="python -m fed_ros.ros.bench.wire_overhead")
    parser.add_argument("--role", choices=("sender", "receiver"), default=None)
    parser.add_argument("--encoding", default="float32")
    parser.add_argument("--encodings", default="float32,int8_delta")
    parser.add_argument("--policy", choices=("lowdim", "image"), default="lowdim")
    parser.add_argument("--updates", type=int, default=10)
    parser.add_argument("--busy", default="0,2", help="comma list of busy-loop counts")
    parser.add_argument("--retry-s", type=float, default=2.0, help="0 = never re-send")
    parser.add_argument("--settle-s", type=float, default=1.0)
    parser.add_argument("--transfer-timeout", type=float, default=30.0)
    parser.add_argument("--rate", type=float, default=0.0, help="tbf Mbit/s (0 = unshaped)")
    parser.add_argument(
        "--buffers",
        default="0",
        help="comma list of UDP socket buffer bytes for both hosts, measured in turn "
        "(fed_ros/ros/wire/socket_buffers.py); 0 = Fast DDS defaults; paced = the paced "
        "profile for --rate (fed_ros/ros/wire/pacing.py)",
    )
    parser.add_argument("--json", default="", help="also write the measurements here")
    args = parser.parse_args(argv)
    if args.updates < 1 or args.retry_s < 0 or args.settle_s < 0:
        raise SystemExit(
            f"--updates >= 1, --retry-s >= 0, --settle-s >= 0 "
            f"(got {args.updates}, {args.retry_s}, {args.settle_s})"
        )
    if args.role == "sender":
        _sender(args)
        return 0
    if args.role == "receiver":
        _receiver(args)
        return 0
    from fed_ros.ros.rigs.netns import Network, unavailable_reason

    reason = unavailable_reason()
    if reason:
        raise SystemExit(f"wire overhead needs network namespaces: {reason}")
    try:
        busy_levels = [int(b) for b in args.busy.split(",") if b.strip()]
        buffer_sizes = [
            b.strip() if b.strip() == "paced" else int(b)
            for b in args.buffers.split(",")
            if b.strip()
        ]
    except ValueError:
        raise SystemExit(
            f"--busy must be a comma list of ints and --buffers of ints or 'paced', got "
            f"{args.busy!r}, {args.buffers!r}"
        ) from None
    if "paced" in buffer_sizes and args.rate <= 0:
        raise SystemExit("--buffers paced paces to a link's rate: give --rate MBIT")
    rates = {"robot": args.rate} if args.rate > 0 else {}
    found = []
    with Network(["server", "robot"], rates=rates) as net:
        for busy in busy_levels:
            for buffers in buffer_sizes:
                for encoding in [e.strip() for e in args.encodings.split(",") if e.strip()]:
                    m = measure(net, args, encoding, busy, buffers)
                    found.append(m)
                    print(json.dumps(summary(m)), flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(found, indent=1))
    print(
        f"\nROS chunks robot -> server between two namespaces ({args.policy} policy, "
        f"retry {args.retry_s:g} s, link {args.rate or 'unshaped'}; buffers 0 = Fast DDS "
        f"default): link bytes out of the robot "
        f"per payload byte, per update"
    )
    print(
        f"{'encoding':<11} {'busy':>4} {'buffers':>8} {'load':>5} {'payload B':>10} "
        f"{'tx/payload':>22} "
        f"{'resent':>7} {'ack s med/max':>14} {'rcvbuf drops':>12}"
    )
    for m in found:
        s = summary(m)
        ratio = (
            f"{s['tx_over_payload_median']:.2f} ({s['tx_over_payload_min']:.2f}-"
            f"{s['tx_over_payload_max']:.2f})"
        )
        ack = "-" if s["ack_s_median"] is None else f"{s['ack_s_median']:.2f}/{s['ack_s_max']:.2f}"
        print(
            f"{s['encoding']:<11} {s['busy']:>4} {s['buffers']:>8} {s['load1']:>5.1f} "
            f"{s['payload_bytes']:>10} "
            f"{ratio:>22} {s['resent_updates']:>3}/{s['updates']:<3} {ack:>14} "
            f"{s['rcvbuf_drops']:>12}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
