"""The two processes of one `fed-ros bench transfer` measurement: a sender and a receiver.

``fed-ros bench transfer`` (:mod:`fed_ros.ros.bench.transfer`) starts itself twice per method
with ``--role sender`` / ``--role receiver``; :func:`run_worker` is what such a process runs.
The workers stand apart from the orchestration because they are the only code that runs
inside the measured processes: the ROS 2 node pair (ModelUpdate chunks, or a bulk control
message whose bytes the receiver pulls from the sender's BulkServer) and the raw pyzmq
PUSH/PULL reference. The receiver prints its times as one ``RESULT {json}`` line.
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

import numpy as np

# How long a worker waits for its peer to be discovered (the orchestration's timeouts add it).
READY_TIMEOUT_S = 20.0


def bench_payload(megabytes: float) -> dict[str, np.ndarray]:
    """A float32 state dict of the requested size (a few tensors, like a policy)."""
    n = int(megabytes * 1e6) // 4
    rng = np.random.default_rng(0)
    sizes = [n // 2, n // 4, n // 8, n - n // 2 - n // 4 - n // 8]
    return {
        f"layer{i}.weight": rng.standard_normal(s, dtype=np.float32) for i, s in enumerate(sizes)
    }


def _emit(obj: dict[str, Any]) -> None:
    print("RESULT " + json.dumps(obj), flush=True)


def _ros_sender(args: argparse.Namespace) -> None:
    import rclpy
    from std_msgs.msg import String

    from fed_ros.msg import ModelUpdate
    from fed_ros.ros.wire.round_msgs import model_update_msg
    from fed_ros.ros.wire.tensors import encode_state_dict
    from fed_ros.ros.wire.qos import control_qos
    from fed_ros.ros.wire.bulk import BulkServer
    from fed_ros.ros.wire.chunk_sender import ChunkedSender

    encoded = encode_state_dict(bench_payload(args.mb))
    rclpy.init()
    node = rclpy.create_node("bench_robot")
    pub = node.create_publisher(ModelUpdate, "bench/updates", control_qos())
    acks: list[dict] = []
    node.create_subscription(
        String, "bench/acks", lambda m: acks.append(json.loads(m.data)), control_qos()
    )
    bulk = BulkServer() if args.method == "zmq_bulk" else None
    deadline = time.monotonic() + READY_TIMEOUT_S
    while (
        pub.get_subscription_count() < 1 or node.count_publishers("bench/acks") < 1
    ) and time.monotonic() < deadline:
        rclpy.spin_once(node, timeout_sec=0.05)
    time.sleep(0.5)  # let discovery settle in both directions
    for i in range(args.warmup + args.repeats):  # warm-ups are dropped by the receiver
        t0 = time.time()
        uri = bulk.offer(encoded.data) if bulk else ""
        sender = ChunkedSender(encoded, f"bench/{i}", chunk_bytes=args.chunk_bytes, bulk_uri=uri)
        for chunk in sender.chunks():
            msg = model_update_msg(chunk, robot_id="bench_robot", round_idx=i, base_round=0)
            msg.header.stamp.sec = int(t0)
            msg.header.stamp.nanosec = int((t0 % 1) * 1e9)
            pub.publish(msg)
        wait = time.monotonic() + args.transfer_timeout
        while len(acks) <= i and time.monotonic() < wait:
            rclpy.spin_once(node, timeout_sec=0.05)
        if bulk:
            bulk.withdraw(uri)
    if bulk:
        bulk.close()
    node.destroy_node()
    rclpy.shutdown()


def _ros_receiver(args: argparse.Namespace) -> None:
    import rclpy
    from std_msgs.msg import String

    from fed_ros.msg import ModelUpdate
    from fed_ros.ros.wire.qos import control_qos
    from fed_ros.ros.wire.bulk_fetch import fetch_bulk
    from fed_ros.ros.wire.chunk_assembler import PayloadAssembler, TransferLimits

    rclpy.init()
    node = rclpy.create_node("bench_server")
    ack = node.create_publisher(String, "bench/acks", control_qos())
    assembler = PayloadAssembler(TransferLimits(max_total_bytes=1 << 30, max_chunk_bytes=1 << 30))
    times: list[float] = []

    def on_update(msg: ModelUpdate) -> None:
        if msg.payload.bulk_uri:
            fetch_bulk(msg.payload, limits=assembler.limits)
            done = True
        else:
            done = assembler.add(msg.payload) is not None
        if done:
            t1 = time.time()
            t0 = msg.header.stamp.sec + msg.header.stamp.nanosec * 1e-9
            times.append(t1 - t0)
            ack.publish(String(data=json.dumps({"round": msg.round})))

    node.create_subscription(ModelUpdate, "bench/updates", on_update, control_qos())
    deadline = (
        time.monotonic() + READY_TIMEOUT_S + args.transfer_timeout * (args.warmup + args.repeats)
    )
    while len(times) < args.warmup + args.repeats and time.monotonic() < deadline:
        rclpy.spin_once(node, timeout_sec=0.05)
    time.sleep(0.3)  # let the last ack go out
    _emit({"times": times[args.warmup :]})
    node.destroy_node()
    rclpy.shutdown()


def _zmq_sender(args: argparse.Namespace) -> None:
    import zmq

    from fed_ros.ros.wire.tensors import encode_state_dict

    encoded = encode_state_dict(bench_payload(args.mb))
    ctx = zmq.Context()
    push = ctx.socket(zmq.PUSH)
    push.connect(f"tcp://{args.peer}:{args.port}")
    acks = ctx.socket(zmq.PULL)
    acks.connect(f"tcp://{args.peer}:{args.port + 1}")
    for _ in range(args.warmup + args.repeats):
        t0 = time.time()
        push.send_multipart([str(t0).encode(), encoded.data], copy=False)
        acks.recv()
    push.close(0)
    acks.close(0)
    ctx.term()


def _zmq_receiver(args: argparse.Namespace) -> None:
    import zmq

    ctx = zmq.Context()
    pull = ctx.socket(zmq.PULL)
    pull.bind(f"tcp://{args.bind_host}:{args.port}")
    acks = ctx.socket(zmq.PUSH)
    acks.bind(f"tcp://{args.bind_host}:{args.port + 1}")
    times = []
    for _ in range(args.warmup + args.repeats):
        stamp, frame = pull.recv_multipart(copy=False)
        times.append(time.time() - float(stamp.bytes))
        assert len(frame) > 0
        acks.send(b"ok")
    _emit({"times": times[args.warmup :]})
    pull.close(0)
    acks.close(0)
    ctx.term()


def run_worker(args: argparse.Namespace) -> None:
    """Run the process of ``args.role`` (sender or receiver) for ``args.method``."""
    worker = {("sender", "raw_zmq"): _zmq_sender, ("receiver", "raw_zmq"): _zmq_receiver}.get(
        (args.role, args.method), _ros_sender if args.role == "sender" else _ros_receiver
    )
    worker(args)
