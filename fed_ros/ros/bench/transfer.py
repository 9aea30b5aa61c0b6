"""`fed-ros bench transfer`: a 21.5 MB model update robot -> server between two processes.

Methods, each run with a fresh sender ("robot") and receiver ("server") process:
- ``raw_zmq``: pyzmq PUSH/PULL over loopback TCP, one frame, copy=False, no checks (the
  reference every ratio is relative to);
- ``ros_default``: fed_ros ModelUpdate chunks over Fast DDS with its default transports;
- ``ros_tuned``: the same with config/fastdds_shm.xml (shared memory only, 32 MiB segment);
- ``zmq_bulk``: the fed_ros default for large payloads: a ModelUpdate control message over
  ROS 2 (manifest, size, sha256, bulk_uri), the bytes pulled from the robot's BulkServer;
- ``memcpy``: numpy copy of the payload in one process (the memory-bandwidth ceiling).

The ROS and bulk paths are measured end to end as the server sees them: chunks
assembled, size caps checked, sha256 verified. Time = receiver's completion time minus
the sender's start time (same host, same clock); the median over repeats is reported.
The two measured processes run :mod:`fed_ros.ros.bench.transfer_workers`; this module
orchestrates them and prints the tables.
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

import numpy as np

from fed_ros.ros.bench.transfer_workers import READY_TIMEOUT_S, bench_payload, run_worker

METHODS = ("raw_zmq", "ros_default", "ros_tuned", "zmq_bulk", "memcpy")
# Methods through a shaped link between two namespace "hosts" (`--shaped`): raw TCP is the
# reference there too; ros_tuned (shared memory) cannot cross hosts, memcpy has no link.
# ros_paced = ROS chunks with a Fast DDS flow controller at 0.95 x the link's rate
# (fed_ros/ros/wire/pacing.py); ros_wan = ROS chunks with the Fast DDS profile given by
# --fastdds-profile, to try other profiles for slow links.
SHAPED_METHODS = ("raw_zmq", "ros_default", "ros_paced", "ros_wan", "zmq_bulk")


def _memcpy(args: argparse.Namespace) -> list[float]:
    src = np.concatenate([v.view(np.uint8) for v in bench_payload(args.mb).values()])
    dst = np.empty_like(src)
    times = []
    for _ in range(args.warmup + args.repeats):
        t0 = time.perf_counter()
        np.copyto(dst, src)
        times.append(time.perf_counter() - t0)
    return times[args.warmup :]


# -------------------------------------------------------------------- orchestration


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1] if s.getsockname()[1] < 65000 else _free_port()


def _run_pair(
    method: str, args: argparse.Namespace, chunk_bytes: int, network: Any = None
) -> list[float]:
    """Start receiver and sender processes for one method; returns the receiver's times.

    With ``network`` (a ``netns.Network`` with hosts "server" and "robot") the receiver runs on
    the server host and the sender on the robot host, over the robot's shaped link.
    """
    env = dict(os.environ)
    # the hosts are namespaces on a bridge: LOCALHOST would never see the peer
    if network is not None:
        env["ROS_AUTOMATIC_DISCOVERY_RANGE"] = "SUBNET"
        env.pop("ROS_LOCALHOST_ONLY", None)
    env.setdefault("ROS_AUTOMATIC_DISCOVERY_RANGE", "LOCALHOST")
    # A random domain in the safe 1..101 range: two benches on one host must not hear each other.
    env.setdefault("ROS_DOMAIN_ID", str(random.SystemRandom().randint(1, 101)))
    env.pop("FASTDDS_DEFAULT_PROFILES_FILE", None)
    env.pop("RMW_FASTRTPS_PUBLICATION_MODE", None)
    paced_dir = None
    if method == "ros_paced":
        from fed_ros.ros.wire.pacing import apply_paced_profile

        if not getattr(args, "link_mbit", None):
            raise SystemExit("ros_paced paces to a link's rate: it runs only through --shaped")
        paced_dir = tempfile.mkdtemp(prefix="fed_ros-paced-")
        apply_paced_profile(env, args.link_mbit, Path(paced_dir))
    if method == "ros_wan":
        # the profile's publish mode (a flow controller needs async)
        env["RMW_FASTRTPS_PUBLICATION_MODE"] = "AUTO"
    if method in ("ros_tuned", "ros_wan"):
        from fed_ros.ros.wire.fastdds_profile import apply_fastdds_profile

        profile = Path(args.fastdds_profile) if args.fastdds_profile else None
        if method == "ros_wan" and profile is None:
            raise SystemExit("ros_wan measures a Fast DDS profile: pass --fastdds-profile FILE")
        if apply_fastdds_profile(env, path=profile) is None:
            raise SystemExit(
                f"Fast DDS profile {profile or 'config/fastdds_shm.xml'} not found; "
                f"cannot run {method}"
            )
    common = [
        "--mb",
        str(args.mb),
        "--repeats",
        str(args.repeats),
        "--warmup",
        str(args.warmup),
        "--chunk-bytes",
        str(chunk_bytes),
        "--method",
        method,
        "--port",
        str(_free_port()),
        "--transfer-timeout",
        str(args.transfer_timeout),
    ]
    cmd = [sys.executable, "-m", "fed_ros.ros.bench.transfer"]
    recv_cmd, send_cmd = [*cmd, "--role", "receiver", *common], [*cmd, "--role", "sender", *common]
    recv_env, send_env = env, env
    if network is not None:
        server, robot = network.hosts["server"], network.hosts["robot"]
        recv_cmd = network.command("server", [*recv_cmd, "--bind-host", "0.0.0.0"])
        send_cmd = network.command("robot", [*send_cmd, "--peer", server.address])
        recv_env = dict(env, FED_ROS_BULK_HOST=server.address)
        send_env = dict(env, FED_ROS_BULK_HOST=robot.address)  # the robot serves its update's bytes
    recv = subprocess.Popen(
        recv_cmd, env=recv_env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    time.sleep(0.3)
    send = subprocess.Popen(
        send_cmd, env=send_env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    try:
        out, _ = recv.communicate(
            timeout=READY_TIMEOUT_S + args.transfer_timeout * (args.warmup + args.repeats) + 10
        )
        send.wait(timeout=args.transfer_timeout)
    finally:
        for p in (recv, send):
            if p.poll() is None:
                p.kill()
                p.wait()
        if paced_dir:
            shutil.rmtree(paced_dir, ignore_errors=True)
    for line in out.splitlines():
        if line.startswith("RESULT "):
            times = json.loads(line[7:])["times"]
            if len(times) < args.repeats:
                raise RuntimeError(
                    f"{method}: only {len(times)}/{args.repeats} transfers completed\n{out[-2000:]}"
                )
            return times
    raise RuntimeError(f"{method}: receiver printed no result\n{out[-3000:]}")


def main(argv: list[str] | None = None) -> int:
    """Entry point of `fed-ros bench transfer`; prints a side-by-side table, returns 0."""
    from fed_ros.ros.wire.chunk_sender import DEFAULT_CHUNK_BYTES

    parser = argparse.ArgumentParser(
        prog="fed-ros bench transfer", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--mb", type=float, default=21.5, help="payload size in MB (1e6 bytes)")
    parser.add_argument(
        "--repeats", type=int, default=5, help="timed transfers per method (after the warm-ups)"
    )
    parser.add_argument(
        "--rounds",
        type=int,
        default=1,
        help="run the method list this many times, interleaved; rows pool every round's times",
    )
    parser.add_argument(
        "--warmup",
        type=int,
        default=3,
        help="untimed transfers first (TCP windows, allocator and page faults settle)",
    )
    parser.add_argument(
        "--chunk-bytes", type=int, default=DEFAULT_CHUNK_BYTES, help="ROS chunk size"
    )
    parser.add_argument("--methods", default=",".join(METHODS), help=f"comma list of {METHODS}")
    parser.add_argument(
        "--chunk-sweep",
        action="store_true",
        help="also time ros_default/ros_tuned at 1, 2, 4, 8 MiB chunks and unchunked",
    )
    parser.add_argument(
        "--fastdds-profile",
        default="",
        help="Fast DDS XML for ros_tuned (default: config/fastdds_shm.xml) and ros_wan (required)",
    )
    parser.add_argument("--json", default="", help="write the results to this file")
    parser.add_argument(
        "--shaped",
        default="",
        help="also measure through a tbf-shaped link between two network-namespace hosts "
        "(root): comma list of rates in Mbit/s, e.g. 20,1",
    )
    parser.add_argument(
        "--shaped-mb", type=float, default=4.0, help="payload size (MB) through shaped links"
    )
    parser.add_argument(
        "--shaped-methods",
        default="raw_zmq,ros_default,ros_paced,zmq_bulk",
        help=f"comma list of {SHAPED_METHODS} for --shaped",
    )
    parser.add_argument(
        "--shaped-encodings",
        default="",
        help="instead of --shaped-mb: a real policy update per encoding, e.g. "
        "float32,int8_block,topk:0.05 (end to end: encode + transfer + decode)",
    )
    parser.add_argument("--shaped-policy", choices=("lowdim", "image"), default="image")
    parser.add_argument(
        "--transfer-timeout",
        type=float,
        default=30.0,
        help="seconds one transfer may take before the method counts as not completing",
    )
    parser.add_argument("--peer", default="127.0.0.1", help=argparse.SUPPRESS)
    parser.add_argument("--bind-host", default="127.0.0.1", help=argparse.SUPPRESS)
    parser.add_argument("--role", choices=("sender", "receiver"), help=argparse.SUPPRESS)
    parser.add_argument("--method", help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.role:
        run_worker(args)
        return 0
    if args.mb <= 0 or args.repeats < 1 or args.warmup < 0 or args.rounds < 1:
        parser.error(
            f"--mb must be > 0, --repeats >= 1, --warmup >= 0, --rounds >= 1 (got {args.mb}, "
            f"{args.repeats}, {args.warmup}, {args.rounds})"
        )
    methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    unknown = [m for m in methods if m not in METHODS]
    if unknown:
        parser.error(f"unknown methods {unknown}; choose from {METHODS}")
    # Rounds interleave the methods (raw, bulk, raw, bulk, ...) so that a change in the load of a
    # shared machine hits every method alike; each row pools its times over all rounds.
    pooled: dict[str, list[float]] = {m: [] for m in methods}
    for rnd in range(args.rounds):
        for method in methods:
            times = (
                _memcpy(args) if method == "memcpy" else _run_pair(method, args, args.chunk_bytes)
            )
            pooled[method] += times
            print(
                f"  measured {method} (round {rnd + 1}/{args.rounds}): median "
                f"{statistics.median(times) * 1e3:.1f} ms",
                file=sys.stderr,
            )
    runs: list[tuple[str, int, list[float]]] = [
        (m, 0 if m == "memcpy" else args.chunk_bytes, t) for m, t in pooled.items()
    ]
    if args.chunk_sweep:
        for method in ("ros_default", "ros_tuned"):
            for cb in (1 << 20, 2 << 20, 4 << 20, 8 << 20, 1 << 30):
                runs.append((f"{method}", cb, _run_pair(method, args, cb)))
                print(
                    f"  measured {method} chunk {cb}: "
                    f"median {statistics.median(runs[-1][2]) * 1e3:.1f} ms",
                    file=sys.stderr,
                )
    nbytes = int(args.mb * 1e6) // 4 * 4
    raw = [statistics.median(t) for m, _, t in runs if m == "raw_zmq"]
    ref = nbytes / raw[0] if raw else float("nan")
    print(
        f"\nfed-ros bench transfer: {nbytes / 1e6:.1f} MB robot -> server, two processes, "
        "loopback, "
        f"median of {args.repeats * args.rounds}"
        + (f" ({args.rounds} interleaved rounds)" if args.rounds > 1 else "")
    )
    print(f"{'method':<13} {'chunk':>9} {'median ms':>10} {'MB/s':>9} {'x raw pyzmq':>12}")
    rows = []
    for method, cb, times in runs:
        med = statistics.median(times)
        rate = nbytes / med
        chunk = (
            "-"
            if method in ("raw_zmq", "memcpy")
            else ("whole" if cb >= nbytes else f"{cb >> 20} MiB")
        )
        if method == "zmq_bulk":
            from fed_ros.ros.wire.bulk import DEFAULT_BULK_CHUNK_BYTES

            chunk = f"{DEFAULT_BULK_CHUNK_BYTES >> 20} MiB"
        ratio = f"{rate / ref:.2f}" if raw else "-"  # no raw_zmq row: no reference
        print(f"{method:<13} {chunk:>9} {med * 1e3:>10.1f} {rate / 1e6:>9.0f} {ratio:>12}")
        rows.append(
            {
                "method": method,
                "chunk_bytes": cb,
                "median_s": med,
                "times_s": times,
                "mb_per_s": rate / 1e6,
                "ratio_vs_raw_zmq": rate / ref if raw else None,
            }
        )
    shaped = _shaped(args) if args.shaped and not args.shaped_encodings else []
    if args.shaped and args.shaped_encodings:
        from fed_ros.ros.bench.transfer_encodings import shaped_per_encoding

        shaped = shaped_per_encoding(args, _shaped)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(
                {
                    "bytes": nbytes,
                    "repeats": args.repeats,
                    "rounds": args.rounds,
                    "rows": rows,
                    "shaped": shaped,
                },
                f,
                indent=1,
            )
    return 0


def _shaped(args: argparse.Namespace) -> list[dict[str, Any]]:
    """Each method through a tbf-shaped robot link (two namespace hosts); goodput / link rate."""
    from fed_ros.ros.rigs.netns import Network, unavailable_reason

    reason = unavailable_reason()
    if reason:
        print(f"\nshaped links: not measured ({reason})")
        return []
    rates = [float(r) for r in args.shaped.split(",") if r.strip()]
    methods = [m.strip() for m in args.shaped_methods.split(",") if m.strip()]
    bad = [m for m in methods if m not in SHAPED_METHODS]
    if bad or any(r <= 0 for r in rates):
        raise SystemExit(
            f"--shaped-methods from {SHAPED_METHODS} and rates > 0 (got {bad}, {rates})"
        )
    sub = argparse.Namespace(**{**vars(args), "mb": args.shaped_mb})
    nbytes = int(args.shaped_mb * 1e6) // 4 * 4
    rows: list[dict[str, Any]] = []
    for rate in rates:
        sub.link_mbit = rate  # ros_paced paces to it
        with Network(["server", "robot"], rates={"robot": rate}) as net:
            for method in methods:
                try:
                    med = statistics.median(_run_pair(method, sub, args.chunk_bytes, network=net))
                except (RuntimeError, subprocess.TimeoutExpired) as exc:
                    print(
                        f"  {method} at {rate:g} Mbit/s: did not complete "
                        f"({str(exc).splitlines()[0][:120]})",
                        file=sys.stderr,
                    )
                    med = None
                rows.append(
                    {
                        "rate_mbit": rate,
                        "method": method,
                        "median_s": med,
                        "goodput_of_link": None if med is None else nbytes * 8 / med / (rate * 1e6),
                    }
                )
                if med is not None:
                    print(
                        f"  measured {method} at {rate:g} Mbit/s: median {med:.2f} s",
                        file=sys.stderr,
                    )
    print(
        "\nthrough a tbf-shaped link (robot host -> server host, network namespaces, "
        "own /dev/shm): "
        f"{nbytes / 1e6:.1f} MB, median of {args.repeats}; goodput as a fraction of the link rate"
    )
    print(f"{'link':>9} {'method':<13} {'median s':>9} {'Mbit/s':>8} {'of link':>8}")
    for row in rows:
        med = row["median_s"]
        if med is None:
            missing = "no completion in " + str(int(args.transfer_timeout)) + " s"
            print(f"{row['rate_mbit']:>6g} Mb {row['method']:<13} {missing:>27}")
        else:
            print(
                f"{row['rate_mbit']:>6g} Mb {row['method']:<13} {med:>9.2f} "
                f"{nbytes * 8 / med / 1e6:>8.1f} "
                f"{row['goodput_of_link']:>8.2f}"
            )
    return rows


if __name__ == "__main__":
    sys.exit(main())
