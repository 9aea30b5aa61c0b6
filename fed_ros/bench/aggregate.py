"""`fed-ros bench aggregate`: server aggregation cost against the limits measured in the same run.

For K robots and a synthetic policy of P float32 parameters (a realistic mix of 512x512 and
256x256 weight matrices plus biases; a "temporal." submodule serves as FedDRMan's Omega)
it prints, side by side:

- read pass: one weighted sum over the K x P floats already in memory (a GEMV), the
  memory-bandwidth bound any aggregation must pay;
- FedAvg: the full `FedAvgStrategy.aggregate_round` (validation + average), target <= 2x;
- SVD: LAPACK gesdd of every block SRB rebalances, for each of the C clusters;
- FedDRMan: CUA + per-cluster averages + SRB + persistent models, target <= 1.5x (FedAvg + SVD);
  and the same round as the server node runs it, with CUA's Gram rows computed as each update
  is admitted (`Strategy.observe`, `arrival_gram`): the CPU of those arrivals (per update and
  in all, spent while the server waits for the rest of the fleet) and the close that is left;
- FeDepth: a steady-state round (multi-membership averages) and, once, the round-0
  clustering (Jeffreys matrix, tau calibration to 20% overlap, subset merging);
- peak: traced heap peak during the FedDRMan step, in model sizes, and the process's peak
  RssAnon / RssFile (sampled every 5 ms).

Each cell runs two paths over the same updates, one after the other: **stacked** (the K
updates in an `UpdateBuffer` on the heap, stacked as (K, P): K + 3 model sizes) and
**streamed** (the K updates in the server's spill file, `fed_ros.core.rounds.spill`, read in
place block by block: C models + one block on the heap, the rows in page cache). The two give
the same bits (test_core_streamed_aggregation). For the streamed FedDRMan round it also
prints where the time goes: CUA's similarity matrix (K^2 x |Omega| multiply-adds) and the
partition; the rest is the per-cluster averages and SRB.

Times are CPU seconds of the process (`time.process_time`, BLAS threads included): on the
shared 2-core machine other jobs changed wall times by up to 10x between runs (2026-12-07),
CPU seconds far less. Run with `--threads 1` (or OMP_NUM_THREADS=1) to compare runs.

Then CUA partition time for K up to 1000 (target <= 2 s) and the scalable solver's
objective gap to exact enumeration for K <= 12 (target <= 1%).
"""

from __future__ import annotations

import argparse
import gc
import tempfile
import threading
import time
import tracemalloc
from collections.abc import Callable
from functools import partial

import numpy as np
import scipy.linalg

from fed_ros.core.strategies.aggregate import cosine_similarity_matrix, update_similarity
from fed_ros.core.clustering.cua import cua_exact, cua_partition, cua_scalable
from fed_ros.core.params import (
    Manifest,
    TensorSpec,
    UpdateBuffer,
    num_params,
    prefix_columns,
    stack_state_dicts,
    unflatten,
)
from fed_ros.core.clustering.srb import eligible_blocks
from fed_ros.core.rounds.spill import UpdateSpill
from fed_ros.core.strategies.base import make_strategy
from fed_ros.core.strategies.streamed import omega_similarity
from fed_ros.core.strategies.types import ClientDescriptor, ClientUpdate

NUM_CLUSTERS = 2


def synthetic_manifest(target_params: int) -> Manifest:
    """Mix of 512x512 / 256x256 matrices with biases, ~target_params scalars, ~1/4 under
    'temporal.'."""
    specs: list[TensorSpec] = []
    total = 0
    i = 0
    while total < target_params:
        big = (i % 4) != 3
        n = 512 if big else 256
        prefix = "temporal" if i % 4 == 1 else ("encoder" if i % 4 in (0, 3) else "head")
        specs.append(TensorSpec(f"{prefix}.layer{i}.weight", (n, n), "float32"))
        specs.append(TensorSpec(f"{prefix}.layer{i}.bias", (n,), "float32"))
        total += n * n + n
        i += 1
    return tuple(specs)


class _Updates:
    """Robot k's update: theta^0 + its group's direction + a mix of three shared directions
    (the same floats whichever container, buffer or spill, they are written into)."""

    def __init__(self, P: int, seed: int) -> None:
        rng = np.random.default_rng(seed)
        self.theta0 = rng.standard_normal(P, dtype=np.float32) * 0.02
        self.dirs = rng.standard_normal((NUM_CLUSTERS, P), dtype=np.float32) * 0.01
        self.pool = rng.standard_normal((3, P), dtype=np.float32) * 0.002
        self.seed = seed

    def row(self, k: int, out: np.ndarray) -> np.ndarray:
        """Write robot k's update into ``out`` (P,)."""
        np.add(self.theta0, self.dirs[k % NUM_CLUSTERS], out=out)
        c = np.random.default_rng((self.seed, k)).standard_normal(3).astype(np.float32)
        for j in range(3):
            out += c[j] * self.pool[j]
        return out


def _fill_updates(manifest: Manifest, K: int, seed: int) -> tuple[_Updates, UpdateBuffer]:
    """The update maker and K updates written into one UpdateBuffer: two groups plus noise."""
    maker = _Updates(num_params(manifest), seed)
    buf = UpdateBuffer(manifest, K)
    for k in range(K):
        buf.slot()
        maker.row(k, buf.data[k])
    return maker, buf


def _updates(buf: UpdateBuffer, K: int) -> list[ClientUpdate]:
    return [
        ClientUpdate(f"robot_{k:04d}", unflatten(buf.data[k], buf.manifest), 100 + k, 0)
        for k in range(K)
    ]


def _descriptors(K: int, seed: int) -> dict[str, ClientDescriptor]:
    rng = np.random.default_rng(seed)
    return {
        f"robot_{k:04d}": ClientDescriptor(
            f"robot_{k:04d}",
            "gaussian",
            mean=3.0 * (k % NUM_CLUSTERS) + 0.3 * rng.standard_normal(64),
            variance=rng.uniform(0.95, 1.05, 64),
            num_samples=100,
        )
        for k in range(K)
    }


class _RssPeaks:
    """Peak RssAnon and RssFile of this process (MB), sampled every 5 ms while active.

    Anonymous memory is what the kernel cannot reclaim (the heap: decoded or stacked models);
    file pages (the spill file's rows) are written back and dropped under memory pressure.
    """

    def __init__(self) -> None:
        self.anon = self.file = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    @staticmethod
    def now() -> tuple[float, float]:
        """Current (RssAnon, RssFile) in MB, from /proc/self/status."""
        vals = {}
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(("RssAnon:", "RssFile:")):
                    vals[line.split(":")[0]] = int(line.split()[1]) / 1024.0
        return vals.get("RssAnon", 0.0), vals.get("RssFile", 0.0)

    def _sample(self) -> None:
        while True:
            anon, file = self.now()
            self.anon, self.file = max(self.anon, anon), max(self.file, file)
            if self._stop.wait(0.005):
                return

    def __enter__(self) -> "_RssPeaks":
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def _peak_models(fn: Callable[[], object], model_bytes: int) -> tuple[float, "_RssPeaks"]:
    """Traced heap peak of fn() in model sizes (above what was allocated before), RSS peaks."""
    gc.collect()
    tracemalloc.start()
    before, _ = tracemalloc.get_traced_memory()
    with _RssPeaks() as rss:
        fn()
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return (peak - before) / model_bytes, rss


def _timings(
    manifest: Manifest,
    theta0: np.ndarray,
    updates: list[ClientUpdate],
    desc: dict[str, ClientDescriptor],
    reps: int,
    bounds: dict[str, Callable[[], object]],
    with_stacked: bool = True,
) -> dict[str, dict[str, float]]:
    """Best-of times of both paths over the same updates and of the ``bounds`` they are
    compared with (read pass, SVD), alternating call by call so that a load change on a
    shared machine hits all of them alike."""
    K = len(updates)
    initial = unflatten(theta0, manifest)
    ids = [u.robot_id for u in updates]
    fast_reps = max(10, 3 * reps) if K <= 100 else max(2, reps)
    best: dict[str, dict[str, float]] = {"stacked": {}, "streamed": {}, "bounds": {}}

    def fresh(name: str, stack: bool, **kw: object):
        s = make_strategy(name, stack_updates=stack, **kw)
        s.initialize(initial, ids)
        return s

    def timed(path: str, key: str, fn: Callable[[], object]) -> None:
        t = time.process_time()
        fn()
        dt = time.process_time() - t
        best[path][key] = min(best[path].get(key, np.inf), dt)

    paths = {"stacked": True, "streamed": False} if with_stacked else {"streamed": False}
    for path, stack in paths.items():  # round 0 of FeDepth clusters (once per path)
        fdp = fresh("fedepth", stack, target_overlap=0.2)
        timed(path, "fedepth_cluster", lambda: fdp.aggregate_round(0, updates, desc))
        best[path]["_fedepth"] = fdp
    for rep in range(fast_reps):
        for path, stack in paths.items():
            fedavg = fresh("fedavg", stack)
            timed(path, "fedavg", lambda: fedavg.aggregate_round(0, updates, {}))
            fdp = best[path]["_fedepth"]
            timed(path, "fedepth", lambda: fdp.aggregate_round(1, updates, {}))
            if rep < max(1, reps - 1):
                drm = fresh("feddrman", stack, num_clusters=NUM_CLUSTERS, beta=0.9)
                timed(path, "feddrman", lambda: drm.aggregate_round(0, updates, {}))
                if not stack:  # the server node's round: Gram rows on arrival, then the close
                    drm = fresh("feddrman", stack, num_clusters=NUM_CLUSTERS, beta=0.9)
                    drm.configure_round(0, ids)  # as the coordinator does: K participants
                    timed(path, "feddrman_arrivals", lambda: _observe_all(drm, updates))
                    timed(path, "feddrman_close", lambda: drm.aggregate_round(0, updates, {}))
        for key, fn in bounds.items():
            if key == "read" or rep < max(1, reps - 1):
                timed("bounds", key, fn)
    for path in paths:
        del best[path]["_fedepth"]
    return best


def _observe_all(strategy: object, updates: list[ClientUpdate]) -> None:
    for u in updates:
        strategy.observe(0, u)  # type: ignore[attr-defined]


def _drm_memory(
    manifest: Manifest, theta0: np.ndarray, updates: list[ClientUpdate], stack: bool
) -> dict[str, float]:
    """Heap and RSS peaks of one FedDRMan round of one path."""
    s = make_strategy("feddrman", num_clusters=NUM_CLUSTERS, beta=0.9, stack_updates=stack)
    s.initialize(unflatten(theta0, manifest), [u.robot_id for u in updates])
    peak, rss = _peak_models(lambda: s.aggregate_round(0, updates, {}), 4 * len(theta0))
    return {"peak": peak, "anon_mb": rss.anon, "file_mb": rss.file}


def _drm_split(
    manifest: Manifest, theta0: np.ndarray, updates: list[ClientUpdate], with_stacked: bool = True
) -> dict:
    """Where a FedDRMan round's CPU time goes: CUA's similarity matrix (streamed and stacked,
    over the same rows) and the partition."""
    names = [s.name for s in manifest if s.name.startswith("temporal.")]
    sds = [u.params for u in updates]
    t = time.process_time()
    S = omega_similarity(sds, manifest, names, unflatten(theta0, manifest))
    t_sim = time.process_time() - t
    t_sim_stacked = float("nan")
    if with_stacked:
        stacked = stack_state_dicts(sds, manifest)  # rows of the spill in order: no copy
        t = time.process_time()
        update_similarity(stacked, prefix_columns(manifest, ("temporal.",)), theta0)
        t_sim_stacked = time.process_time() - t
    t = time.process_time()
    cua_partition(S, NUM_CLUSTERS)
    return {
        "similarity": t_sim,
        "similarity_stacked": t_sim_stacked,
        "cua": time.process_time() - t,
    }


def bench_case(
    K: int,
    P_target: int,
    reps: int,
    seed: int = 0,
    spill_dir: str | None = None,
    with_stacked: bool = True,
) -> dict:
    """One (K, P) cell, both paths side by side. Memory: the stacked path with the updates on
    the heap (an UpdateBuffer, as the server held them), the streamed one with them in the
    server's spill file; one set of updates exists at a time. Times: both paths and the
    bounds over the spilled rows, alternating. ``with_stacked=False`` runs the streamed path
    only (a cell whose K updates would not fit on the heap)."""
    manifest = synthetic_manifest(P_target)
    P = num_params(manifest)
    if with_stacked:
        maker, buf = _fill_updates(manifest, K, seed)
    else:
        maker, buf = _Updates(P, seed), None
    theta0 = maker.theta0
    w = np.full(K, 1.0 / K, dtype=np.float32)
    desc = _descriptors(K, seed)
    blocks = eligible_blocks(manifest)
    shapes = {s.name: s.shape for s in manifest}
    rng = np.random.default_rng(seed + 1)
    mats = {n: rng.standard_normal(shapes[n], dtype=np.float32) for n in blocks}

    def svds() -> None:
        for _ in range(NUM_CLUSTERS):
            for m in mats.values():
                scipy.linalg.svd(m, full_matrices=False, lapack_driver="gesdd", check_finite=False)

    old: dict[str, float] = {}
    if buf is not None:
        # Memory of today's server: the K updates on the heap (an UpdateBuffer), stacked.
        old = _drm_memory(manifest, theta0, _updates(buf, K), True)
        old["peak"] += K  # the K updates themselves live on the heap (the UpdateBuffer)
        del buf
        gc.collect()
    with tempfile.TemporaryDirectory(prefix="fed_ros_bench_spill_", dir=spill_dir) as d:
        spill = UpdateSpill(manifest, K, d)
        row = np.empty(P, dtype=np.float32)
        ups = [
            ClientUpdate(
                f"robot_{k:04d}", spill.add(unflatten(maker.row(k, row), manifest)), 100 + k, 0
            )
            for k in range(K)
        ]
        new = _drm_memory(manifest, theta0, ups, False)
        # Times: both paths over the spilled rows, alternating (the stacked path stacks them
        # without a copy: they are rows of one array in order, as in an UpdateBuffer).
        bounds = {"read": partial(np.dot, w, spill.data), "svd": svds}
        times = _timings(manifest, theta0, ups, desc, reps, bounds, with_stacked)
        split = _drm_split(manifest, theta0, ups, with_stacked)
        del ups, spill, bounds
    mats.clear()
    gc.collect()
    if with_stacked:
        old.update(times["stacked"])
    new.update(times["streamed"])
    return {
        "K": K,
        "P": P,
        "read": times["bounds"]["read"],
        "svd": times["bounds"]["svd"],
        "blocks": len(blocks),
        "stacked": old or None,
        "streamed": new,
        "split": split,
    }


def bench_cua(
    sizes: list[int], gap_trials: int, seed: int = 0
) -> tuple[list[tuple[int, float, float]], list[float]]:
    """Scalable CUA time (and agreement with the planted partition) per K; gaps vs exact for
    K <= 12."""
    rng = np.random.default_rng(seed)
    times = []
    for K in sizes:
        C = 3
        centers = rng.normal(size=(C, 64))
        labels = np.concatenate([np.arange(C), rng.integers(0, C, K - C)])
        S = cosine_similarity_matrix(centers[labels] + 0.8 * rng.normal(size=(K, 64)))
        t = time.process_time()
        res = cua_scalable(S, C, seed=seed)
        dt = time.process_time() - t
        agree = len({(a, b) for a, b in zip(res.labels, labels)}) == C
        times.append((K, dt, float(agree)))
    gaps = []
    for trial in range(gap_trials):
        K = int(rng.integers(5, 13))
        C = int(rng.integers(2, 5))
        centers = rng.normal(size=(C, 32))
        labels = rng.integers(0, C, K)
        S = cosine_similarity_matrix(
            centers[labels] + float(rng.uniform(0.3, 3.0)) * rng.normal(size=(K, 32))
        )
        ex = cua_exact(S, C)
        sc = cua_scalable(S, C, seed=trial)
        gaps.append((ex.objective - sc.objective) / max(abs(ex.objective), 1e-12))
    return times, gaps


def main(argv: list[str] | None = None) -> int:
    """Run the aggregation benchmark and print the comparison table."""
    ap = argparse.ArgumentParser(
        prog="fed-ros bench aggregate", description=__doc__.splitlines()[0]
    )
    ap.add_argument("--quick", action="store_true", help="K in {5, 20}, P = 1M, fewer repeats")
    ap.add_argument("--ks", type=int, nargs="*", help="robot counts (default 5 20 100)")
    ap.add_argument(
        "--ps", type=float, nargs="*", help="parameter counts in millions (default 1 5.4)"
    )
    ap.add_argument("--reps", type=int, default=None, help="repeats per timing (best of)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--spill-dir", default=None, help="directory of the streamed path's spill file (a temp dir)"
    )
    ap.add_argument(
        "--streamed-only",
        action="store_true",
        help="skip the stacked path (for cells whose K updates do not fit on the heap)",
    )
    ap.add_argument(
        "--threads",
        type=int,
        default=None,
        help="cap BLAS/LAPACK threads (threadpoolctl); on a busy machine 1 gives steadier numbers",
    )
    args = ap.parse_args(argv)
    if args.threads is not None:
        if args.threads < 1:
            raise ValueError(f"--threads must be >= 1, got {args.threads}")
        from threadpoolctl import threadpool_limits  # ships with scikit-learn

        with threadpool_limits(args.threads):
            return _run(args)
    return _run(args)


def _run(args: argparse.Namespace) -> int:
    ks = args.ks or ([5, 20] if args.quick else [5, 20, 100])
    ps = args.ps or ([1.0] if args.quick else [1.0, 5.4])
    reps = args.reps or (2 if args.quick else 3)
    for k in ks:
        if k < NUM_CLUSTERS:
            raise ValueError(f"--ks value {k} is below the {NUM_CLUSTERS} FedDRMan clusters")

    print(
        f"fed-ros bench aggregate  (C={NUM_CLUSTERS} FedDRMan clusters, beta=0.9, float32; CPU "
        f"seconds of the process, best of {reps}, FedAvg/FeDepth best of {max(10, 3 * reps)} up "
        "to K = 100)"
    )
    hdr = (
        f"{'K':>4} {'P':>8} {'path':>8} | {'FedAvg':>8} {'x read':>6} | {'FedDRMan':>8} "
        f"{'x(FA+SVD)':>9} {'<=1.5':>5} | {'FeDepth':>8} {'+clust':>7} {'<=2s':>4} | "
        f"{'heap':>6} {'RssAnon':>8} {'RssFile':>8}"
    )
    ok = lambda c: "yes" if c else "NO"  # noqa: E731
    for p in ps:
        for k in ks:
            r = bench_case(k, int(p * 1e6), reps, args.seed, args.spill_dir, not args.streamed_only)
            print(
                f"\nK={k} P={r['P']}: read pass {r['read'] * 1e3:.1f} ms, SVD of the "
                f"{r['blocks']} SRB blocks x {NUM_CLUSTERS} clusters {r['svd'] * 1e3:.0f} ms"
            )
            print(hdr)
            print("-" * len(hdr))
            for path in ("stacked", "streamed"):
                c = r[path]
                if c is None:
                    continue
                drm_ratio = c["feddrman"] / (c["fedavg"] + r["svd"])
                print(
                    f"{k:>4} {r['P']:>8} {path:>8} | {c['fedavg'] * 1e3:>6.0f}ms "
                    f"{c['fedavg'] / r['read']:>6.2f} | {c['feddrman'] * 1e3:>6.0f}ms "
                    f"{drm_ratio:>9.2f} {ok(drm_ratio <= 1.5):>5} | "
                    f"{c['fedepth'] * 1e3:>6.0f}ms {c['fedepth_cluster']:>6.2f}s "
                    f"{ok(c['fedepth_cluster'] <= 2.0):>4} | {c['peak']:>6.1f} "
                    f"{c['anon_mb']:>6.0f}MB {c['file_mb']:>6.0f}MB",
                    flush=True,
                )
            a, b = r["stacked"], r["streamed"]
            sp = r["split"]
            if a is not None:
                print(
                    f"streamed / stacked: FedAvg {b['fedavg'] / a['fedavg']:.2f}x, FedDRMan "
                    f"{b['feddrman'] / a['feddrman']:.2f}x, heap peak "
                    f"{b['peak'] / a['peak']:.3f}x, RssAnon peak "
                    f"{b['anon_mb'] / max(a['anon_mb'], 1e-9):.2f}x"
                )
            print(
                f"streamed FedDRMan round: CUA similarity {sp['similarity']:.2f} s (stacked "
                f"{sp['similarity_stacked']:.2f} s), CUA partition {sp['cua']:.2f} s, averages + "
                f"SRB + rest {max(0.0, b['feddrman'] - sp['similarity'] - sp['cua']):.2f} s"
            )
            close_ratio = b["feddrman_close"] / (b["fedavg"] + r["svd"])
            print(
                "server FedDRMan round (Gram rows on arrival): close "
                f"{b['feddrman_close'] * 1e3:.0f} ms = {close_ratio:.2f}x (FedAvg + SVD), "
                f"<= 1.5: {ok(close_ratio <= 1.5)}; "
                f"arrivals {b['feddrman_arrivals']:.2f} s in all "
                f"({b['feddrman_arrivals'] / k * 1e3:.1f} ms per update, while the round waits)"
            )
            gc.collect()
    sizes = [12, 100, 300] if args.quick else [12, 100, 300, 1000]
    times, gaps = bench_cua(sizes, 10 if args.quick else 30, args.seed)
    print("\nCUA scalable partition time (C=3, planted groups, target <= 2 s at K=1000):")
    for K, dt, agree in times:
        print(f"  K={K:>5}: {dt:7.3f} s   recovers planted partition: {'yes' if agree else 'no'}")
    g = np.array(gaps)
    print(
        f"CUA objective gap scalable vs exact, {len(g)} random instances K in 5..12, C in 2..4 "
        f"(target <= 1%): max {100 * g.max():.3f}%  mean {100 * g.mean():.4f}%  "
        f"instances > 1%: {int((g > 0.01).sum())}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
