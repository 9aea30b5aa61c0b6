"""`fed-ros bench fleet-scale`: the real server node against N virtual robots, one round each.

The server is the fleet's server process (`fed_ros.ros.nodes.server.server_node`, signatures
required, the allow-list of ``fed-ros keys generate``), FedDRMan with C = ``--families``. The robots
are virtual (:mod:`fed_ros.ros.bench.fleet_scale_robots`): many per rclpy process, real keys, real
announcements, signed updates of the policy's real size and encoding over the real transfer path
(``--channel ros``: chunks on the topic; ``zmq``: the bulk channel), synthetic 'training' with a
family structure. Per N it measures one round:

- ``round_s``: wall time from the TRAIN announcement (its stamp) to the last cluster model of the
  next round assembled in the last robot process;
- the server's CPU seconds (utime + stime, /proc/<pid>/stat) from every robot registered to the
  models delivered, and its peak RSS (VmHWM);
- bytes: the payload bytes the virtual robots sent (update chunks, re-sends included) and
  received (cluster models, once per process), counted by the robots at the application level
  (loopback counters cannot tell the server's traffic from the robots');
- ``cpu_per_update_ms``: the server's CPU outside aggregation per update received (admission:
  signature, digest, decode, checks, plus DDS and the round's bookkeeping; the server reports
  no finer split);
- ``aggregation_s``: the round report's aggregation time (CUA clustering included);
- ``ari``: the adjusted Rand index of the server's clusters against the families.

``--faults`` runs each N twice (deliverable 4 of issue 39): with 10 % of the robots vanishing
mid-round, 10 % sending hostile updates and 1 % re-registering in a storm, and without them
(only the honest robots), and checks that the round completed and that every honest robot's
model digest is the same in both.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np

from fed_ros.ros.bench.fleet_scale_report import (
    ScaleRun,
    fault_summary,
    format_table,
    jitter_comparison,
    write_plot,
)
from fed_ros.ros.bench.fleet_scale_robots import (
    HOSTILE,
    PREPARE_MB,
    UNACKED_MB,
    family_of,
)

WORKER = [sys.executable, "-m", "fed_ros.ros.bench.fleet_scale_robots"]
ENCODINGS = ("float32", "int8_delta")
# Policies by name: (kind, architecture.* fields, as a fleet file's ``architecture:`` sets
# them). image_11m is the issue's ResNet-18-sized policy: ResNet-18's stage widths on the
# image policy's trunk, a wider transformer: 10,926,925 parameters. (The fine-tuned published
# ResNet-18 has a trunk per camera, 22.6M.)
POLICIES: dict[str, tuple[str, dict[str, Any]]] = {
    "image": ("image", {}),
    "lowdim": ("lowdim", {}),
    "image_11m": (
        "image",
        {"conv_channels": [64, 128, 256, 512], "embed_dim": 128, "transformer_ff": 1024},
    ),
}


def fault_plan(n: int) -> dict[int, str]:
    """Which virtual robots misbehave under ``--faults``: 10 % vanish, 10 % hostile (the four
    kinds in turn, at least one of each), 1 % (at least one) storm; the rest (index -> '') are
    honest. Below N = 40 the hostile share is above 10 % (one of each kind)."""
    if n < 10:
        raise ValueError(f"--faults needs at least 10 robots, got {n}")
    vanish, hostile, storm = n // 10, max(len(HOSTILE), n // 10), max(1, n // 100)
    plan = {k: "" for k in range(n)}
    order = list(np.random.default_rng(5).permutation(n))
    for k in order[:vanish]:
        plan[int(k)] = "vanish"
    for j, k in enumerate(order[vanish : vanish + hostile]):
        plan[int(k)] = HOSTILE[j % len(HOSTILE)]
    for k in order[vanish + hostile : vanish + hostile + storm]:
        plan[int(k)] = "storm"
    return plan


def adjusted_rand_index(labels_true: list[int], labels_pred: list[int]) -> float:
    """Adjusted Rand index of two labellings of the same items (1.0: the same partition)."""
    if len(labels_true) != len(labels_pred):
        raise ValueError(f"{len(labels_true)} true labels vs {len(labels_pred)} predicted")
    _, t = np.unique(labels_true, return_inverse=True)
    _, p = np.unique(labels_pred, return_inverse=True)
    table = np.zeros((t.max() + 1, p.max() + 1), np.int64)
    np.add.at(table, (t, p), 1)

    def pairs(x: np.ndarray) -> float:
        return float((x * (x - 1) // 2).sum())

    index, a, b = pairs(table), pairs(table.sum(1)), pairs(table.sum(0))
    total = len(labels_true) * (len(labels_true) - 1) / 2
    expected = a * b / total if total else 0.0
    top = (a + b) / 2 - expected
    return 1.0 if top == 0 else (index - expected) / top


def _proc_cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _proc_hwm_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024.0
    raise RuntimeError(f"no VmHWM for pid {pid}")


class RssSampler:
    """Peaks of a process's RssAnon and RssFile (MB), read from /proc every ``period_s`` in a
    thread (the kernel keeps only VmHWM, their sum's peak)."""

    def __init__(self, pid: int, period_s: float = 0.2) -> None:
        import threading

        self.pid, self.period_s = pid, period_s
        self.peak_anon_mb = self.peak_file_mb = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                text = Path(f"/proc/{self.pid}/status").read_text()
            except OSError:
                return
            for line in text.splitlines():
                if line.startswith("RssAnon:"):
                    self.peak_anon_mb = max(self.peak_anon_mb, int(line.split()[1]) / 1024.0)
                elif line.startswith("RssFile:"):
                    self.peak_file_mb = max(self.peak_file_mb, int(line.split()[1]) / 1024.0)
            self._stop.wait(self.period_s)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)


def server_argv(
    work: Path,
    robots: list[str],
    *,
    policy: str,
    channel: str,
    families: int,
    timeout_s: float,
    quorum_fraction: float,
) -> list[str]:
    """The fleet's server node: FedDRMan, one round, signatures required, the allow-list;
    ``policy`` one of ``POLICIES``."""
    kind, architecture = POLICIES[policy]
    params = {
        "algorithm": "feddrman",
        "rounds": 1,
        "num_clusters": families,
        "policy": kind,
        "state_dir": str(work / "state"),
        "expected_robots": f"[{','.join(robots)}]",
        "min_robots": len(robots),
        "transfer_channel": channel,
        "round_timeout_s": timeout_s,
        "quorum_fraction": quorum_fraction,
        "tracking": "none",
        "seed": 0,
        "require_signatures": "true",
        "allowed_keys_file": str(work / "keys" / "allow_list.yaml"),
        "private_key_file": str(work / "keys" / "server.key"),
    }
    for field, value in architecture.items():
        params[f"architecture.{field}"] = (
            f"[{','.join(str(v) for v in value)}]" if isinstance(value, list) else value
        )
    argv = [sys.executable, "-m", "fed_ros.ros.nodes.server.server_node", "--ros-args"]
    argv += ["-r", "__ns:=/fleet"]
    for key, value in params.items():
        argv += ["-p", f"{key}:={value}"]
    return argv


def make_keys(work: Path, robots: list[str]) -> None:
    """Robot and server key pairs and the allow-list under ``work/keys``, as `fed-ros keys
    generate` writes them (its one line per key goes to ``work/keys.log``)."""
    import contextlib

    with open(work / "keys.log", "w") as log, contextlib.redirect_stdout(log):
        try:  # the operator's key tool (fed_ros.core.security.key_admin, argparse-free)
            from fed_ros.core.security.key_admin import generate_keys

            code = generate_keys(work / "keys", robots, server=True)
        except ImportError:  # before argparse moved out of core: its command line
            from fed_ros.core.security.keys_cli import keys_main  # type: ignore[import-not-found]

            code = keys_main(["generate", *robots, "--server", "--out", str(work / "keys")])
    if code != 0:
        raise RuntimeError(f"fed-ros keys generate failed for {len(robots)} robots: {code}")


def _start(argv: list[str], env: dict[str, str], log: Path) -> subprocess.Popen:
    return subprocess.Popen(
        argv,
        env=env,
        stdout=subprocess.PIPE,
        stderr=open(log, "wb"),
        start_new_session=True,
        text=True,
    )


def _reap(procs: list[subprocess.Popen]) -> None:
    import signal

    for proc in procs:
        if proc.poll() is None:
            try:
                os.killpg(proc.pid, signal.SIGINT)
            except ProcessLookupError:
                pass
    for proc in procs:
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)


def _read_line(proc: subprocess.Popen, event: str, deadline: float, log: Path) -> dict:
    """The next JSON line with ``event`` a worker prints (bounded by ``deadline``)."""
    import selectors

    sel = selectors.DefaultSelector()
    sel.register(proc.stdout, selectors.EVENT_READ)
    try:
        while time.monotonic() < deadline:
            if not sel.select(timeout=min(1.0, max(deadline - time.monotonic(), 0.01))):
                if proc.poll() is not None:
                    break
                continue
            line = proc.stdout.readline()
            if not line:
                break
            try:
                obj = json.loads(line)
            except ValueError:
                continue
            if obj.get("event") == event:
                return obj
    finally:
        sel.close()
    tail = log.read_text(errors="replace")[-3000:] if log.exists() else ""
    raise RuntimeError(f"virtual robots (pid {proc.pid}) gave no {event!r} line:\n{tail}")


def run_round(
    n: int,
    *,
    policy: str = "image",
    encoding: str = "int8_delta",
    channel: str = "ros",
    families: int = 4,
    procs: int = 0,
    faults: dict[int, str] | None = None,
    only: list[int] | None = None,
    timeout_s: float = 900.0,
    round_timeout_s: float = 600.0,
    quorum_fraction: float = 0.75,
    spread_s: float = 0.0,
    retry_jitter: float = 0.5,
    work_dir: Path | None = None,
    env: dict[str, str] | None = None,
    prepare_mb: float = PREPARE_MB,
    unacked_mb: float = UNACKED_MB,
) -> ScaleRun:
    """One round: the server and the virtual robots ``only`` (default all N), behaviours
    ``faults`` (index -> fault, '' honest), sending spread over ``spread_s`` seconds; every
    process is reaped before it returns."""
    from fed_ros.ros.rigs.domains import exclusive_domain_id

    if n < families:
        raise ValueError(f"N = {n} robots < {families} families")
    if encoding not in ENCODINGS:
        raise ValueError(f"encoding must be one of {ENCODINGS}, got {encoding!r}")
    if policy not in POLICIES:
        raise ValueError(f"policy must be one of {tuple(POLICIES)}, got {policy!r}")
    indices = list(range(n)) if only is None else sorted(only)
    ids = [f"robot_{k}" for k in indices]
    behaviour = faults or {}
    procs = procs or max(1, min(4, math.ceil(len(ids) / 100)))
    with (
        tempfile.TemporaryDirectory(prefix="fleet_scale_", dir=work_dir) as tmp,
        exclusive_domain_id() if env is None else _given(env) as domain,
    ):
        work = Path(tmp)
        make_keys(work, ids)
        run_env = dict(os.environ if env is None else env)
        if env is None:
            run_env.pop("ROS_LOCALHOST_ONLY", None)
            run_env.update(ROS_DOMAIN_ID=str(domain), ROS_AUTOMATIC_DISCOVERY_RANGE="LOCALHOST")
        run_env.update(PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1")
        started: list[subprocess.Popen] = []
        try:
            server = _start(
                server_argv(
                    work,
                    ids,
                    policy=policy,
                    channel=channel,
                    families=families,
                    timeout_s=round_timeout_s,
                    quorum_fraction=quorum_fraction,
                ),
                run_env,
                work / "server.log",
            )
            started.append(server)
            rss = RssSampler(server.pid)
            workers = []
            for w in range(procs):
                mine = [[k, f"robot_{k}", behaviour.get(k, "")] for k in indices[w::procs]]
                spec = {
                    "worker": w,
                    "keys_dir": str(work / "keys"),
                    "robots": mine,
                    "families": families,
                    "policy": POLICIES[policy][0],
                    "architecture": POLICIES[policy][1],
                    "encoding": encoding,
                    "channel": channel,
                    "timeout_s": timeout_s,
                    "storm_count": 10,
                    "spread_s": spread_s,
                    "retry_jitter": retry_jitter,
                    "prepare_mb": prepare_mb,
                    "unacked_mb": unacked_mb,
                }
                (work / f"spec_{w}.json").write_text(json.dumps(spec))
                workers.append(
                    _start([*WORKER, str(work / f"spec_{w}.json")], run_env, work / f"w{w}.log")
                )
            started += workers
            deadline = time.monotonic() + timeout_s
            for w, proc in enumerate(workers):
                _read_line(proc, "registered", deadline, work / f"w{w}.log")
            cpu0 = _proc_cpu_s(server.pid)
            results = [
                _read_line(proc, "done", deadline, work / f"w{w}.log")
                for w, proc in enumerate(workers)
            ]
            cpu = _proc_cpu_s(server.pid) - cpu0
            hwm = _proc_hwm_mb(server.pid)
            rss.stop()
        except BaseException:
            log = work / "server.log"
            if log.exists():
                print(log.read_text(errors="replace")[-3000:], file=sys.stderr)
            raise
        finally:
            _reap(started)
    run = _summarise(n, policy, encoding, channel, families, faults, results, cpu, hwm)
    run.retry_jitter = retry_jitter
    run.server_peak_anon_mb, run.server_peak_file_mb = rss.peak_anon_mb, rss.peak_file_mb
    return run


class _given:
    """A domain the caller already holds (its environment names it)."""

    def __init__(self, env: dict[str, str]) -> None:
        self.domain = int(env["ROS_DOMAIN_ID"])

    def __enter__(self) -> int:
        return self.domain

    def __exit__(self, *exc: object) -> None:
        return None


def _summarise(
    n: int,
    policy: str,
    encoding: str,
    channel: str,
    families: int,
    faults: dict[int, str] | None,
    results: list[dict[str, Any]],
    cpu: float,
    hwm: float,
) -> ScaleRun:
    first = results[0]
    clusters = {int(c): members for c, members in first["clusters"].items()}
    member_of = {rid: c for c, members in clusters.items() for rid in members}
    acks = {rid: a for r in results for rid, a in r["acks"].items()}
    # Robots that sent nothing usable keep their old assignment: the ARI is over the updates used.
    grouped = sorted(rid for rid in member_of if acks.get(rid, (False, ""))[0])
    truth = [family_of(int(rid.split("_")[1]), families) for rid in grouped]
    ari = adjusted_rand_index(truth, [member_of[r] for r in grouped]) if grouped else math.nan
    received = int(first["updates_received"])
    agg = float(first["aggregation_seconds"])
    return ScaleRun(
        robots=n,
        policy=policy,
        encoding=encoding,
        channel=channel,
        faults=bool(faults),
        completed=bool(first["completed"]),
        round_s=max(r["delivered_at"] for r in results) - first["announced_at"],
        send_s=max(r["sent_at"] for r in results) - first["announced_at"],
        prepared_used=sum(int(r["prepared_used"]) for r in results),
        resent=sum(int(r["resent"]) for r in results),
        chunks_resent=sum(int(r["chunks_resent"]) for r in results),
        server_cpu_s=cpu,
        server_peak_rss_mb=hwm,
        bytes_out=sum(int(r["bytes_out"]) for r in results),
        bytes_in=sum(int(r["bytes_in"]) for r in results),
        updates_received=received,
        updates_accepted=int(first["updates_accepted"]),
        updates_rejected=int(first["updates_rejected"]),
        aggregation_s=agg,
        cpu_per_update_ms=1000.0 * max(cpu - agg, 0.0) / max(received, 1),
        ari=ari,
        load_average=os.getloadavg()[0],
        robots_delivered=sum(
            int(r["robots"]) for r in results if r["model_digests"] == first["model_digests"]
        ),
        robot_digests={rid: first["model_digests"][str(c)] for rid, c in member_of.items()},
        rejected_codes={rid: a[1] for rid, a in acks.items() if not a[0]},
        accepted_robots=sorted(rid for rid, a in acks.items() if a[0]),
        storm_calls=sum(int(r["storm_calls"]) for r in results),
        storm_accepted=sum(int(r["storm_accepted"]) for r in results),
    )


def compare_faults(n: int, **kw: Any) -> tuple[ScaleRun, ScaleRun, list[str]]:
    """(faulty run, clean run of the honest robots only, honest robots whose digests differ)."""
    plan = fault_plan(n)
    honest = [k for k, f in plan.items() if f in ("", "storm")]
    faulty = run_round(n, faults=plan, **kw)
    clean = run_round(n, only=honest, **kw)
    differ = [
        f"robot_{k}"
        for k in honest
        if faulty.robot_digests.get(f"robot_{k}") != clean.robot_digests.get(f"robot_{k}")
    ]
    return faulty, clean, differ


def main(argv: list[str] | None = None) -> int:
    """Run the sweep; print the tables and write the JSON results and the plot."""
    parser = argparse.ArgumentParser(
        prog="fed-ros bench fleet-scale", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--ns", type=int, nargs="+", default=[10, 30, 100, 300, 1000])
    parser.add_argument("--policies", nargs="+", default=["image"], choices=list(POLICIES))
    parser.add_argument("--encodings", nargs="+", default=["int8_delta"], choices=ENCODINGS)
    parser.add_argument("--channel", default="ros", choices=["ros", "zmq"])
    parser.add_argument("--families", type=int, default=4, help="C: families = clusters")
    parser.add_argument("--procs", type=int, default=0, help="robot processes (0: N/100, <= 4)")
    parser.add_argument("--faults", action="store_true", help="the reliability comparison")
    parser.add_argument(
        "--spread-s",
        type=float,
        default=0.0,
        help="robots send their updates spread evenly over this many seconds (0: all at once)",
    )
    parser.add_argument(
        "--retry-jitters",
        type=float,
        nargs="+",
        default=[0.5],
        help="the robots' re-send spread, each a run side by side (0: the deterministic schedule; "
        "0.5: the robot node's)",
    )
    parser.add_argument("--timeout-s", type=float, default=900.0, help="bound on one run")
    parser.add_argument(
        "--round-timeout-s", type=float, default=600.0, help="the server's round deadline"
    )
    parser.add_argument("--out", type=Path, default=Path("runs/bench/fleet_scale"))
    args = parser.parse_args(argv)
    for n in args.ns:
        if n < args.families:
            parser.error(f"--ns: N = {n} is below --families {args.families}")
    for jitter in args.retry_jitters:
        if not 0.0 <= jitter < 1.0:
            parser.error(f"--retry-jitters: {jitter} is not in [0, 1)")
    args.out.mkdir(parents=True, exist_ok=True)
    common = dict(
        channel=args.channel,
        families=args.families,
        procs=args.procs,
        timeout_s=args.timeout_s,
        round_timeout_s=args.round_timeout_s,
        spread_s=args.spread_s,
    )
    if args.faults:
        for n in args.ns:
            for policy in args.policies:
                for encoding in args.encodings:
                    faulty, clean, differ = compare_faults(
                        n, policy=policy, encoding=encoding, **common
                    )
                    print(f"{policy} {encoding} N={n} with faults vs honest robots only:")
                    print(format_table([faulty, clean]).split("\nfitted")[0])
                    print(fault_summary(faulty, clean, differ))
                    with open(args.out / "faults.jsonl", "a") as f:
                        f.write(
                            json.dumps({"faulty": asdict(faulty), "clean": asdict(clean)}) + "\n"
                        )
        return 0
    groups: dict[str, list[ScaleRun]] = {}
    for policy in args.policies:
        for encoding in args.encodings:
            labels = {}
            for jitter in args.retry_jitters:
                labels[jitter] = f"{policy} {encoding} {args.channel}"
                if args.retry_jitters != [0.5]:
                    labels[jitter] += f" jitter {jitter:g}"
            # Each N's runs back to back, one per jitter, so they see the same load.
            for n in args.ns:
                for jitter, label in labels.items():
                    run = run_round(
                        n, policy=policy, encoding=encoding, retry_jitter=jitter, **common
                    )
                    groups.setdefault(label, []).append(run)
                    print(f"{label} N={n}: {run.round_s:.1f} s, ARI {run.ari:.2f}", flush=True)
                    with open(args.out / "runs.jsonl", "a") as f:
                        row = asdict(run)
                        row.pop("robot_digests")
                        f.write(json.dumps(row) + "\n")
            for label in labels.values():
                print(f"\n{label}\n{format_table(groups[label])}\n", flush=True)
    if len(args.retry_jitters) > 1:
        print(jitter_comparison(groups), flush=True)
    write_plot(groups, args.out / "fleet_scale.png")
    print(f"plot: {args.out / 'fleet_scale.png'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
