"""`fed-ros bench aggregate`: server aggregation cost against the limits measured in the same run.

For K robots and a synthetic policy of P float32 parameters (a realistic mix of 512x512 and
256x256 weight matrices plus biases; a "temporal." submodule serves as FedDRMan's Omega)
it prints, side by side:

- read pass: one weighted sum over the K x P floats already in memory (`w @ stacked`), the
  memory-bandwidth bound any aggregation must pay;
- FedAvg: the full `FedAvgStrategy.aggregate_round` (validation + average), target <= 2x;
- SVD: LAPACK gesdd of every block SRB rebalances, for each of the C clusters;
- FedDRMan: CUA + per-cluster averages + SRB + persistent models, target <= 1.5x (FedAvg + SVD);
- FeDepth: a steady-state round (multi-membership averages) and, once, the round-0
  clustering (Jeffreys matrix, tau calibration to 20% overlap, subset merging);
- peak: traced peak memory during the FedDRMan step, in model sizes, updates included,
  target <= K + 3 (updates arrive in an `UpdateBuffer`, so stacking copies nothing).

Then CUA partition time for K up to 1000 (target <= 2 s) and the scalable solver's
objective gap to exact enumeration for K <= 12 (target <= 1%).
"""

from __future__ import annotations

import argparse
import gc
import time
import tracemalloc
from collections.abc import Callable

import numpy as np
import scipy.linalg

from fed_ros.core.strategies.aggregate import cosine_similarity_matrix
from fed_ros.core.clustering.cua import cua_exact, cua_scalable
from fed_ros.core.params import Manifest, TensorSpec, UpdateBuffer, num_params, unflatten
from fed_ros.core.clustering.srb import eligible_blocks
from fed_ros.core.strategies.base import make_strategy
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


def _fill_updates(manifest: Manifest, K: int, seed: int) -> tuple[np.ndarray, UpdateBuffer]:
    """theta^0 and K updates written into one UpdateBuffer: two latent groups plus noise."""
    rng = np.random.default_rng(seed)
    P = num_params(manifest)
    theta0 = rng.standard_normal(P, dtype=np.float32) * 0.02
    dirs = rng.standard_normal((NUM_CLUSTERS, P), dtype=np.float32) * 0.01
    pool = rng.standard_normal((3, P), dtype=np.float32) * 0.002
    buf = UpdateBuffer(manifest, K)
    for k in range(K):
        buf.slot()
        row = buf.data[k]
        np.add(theta0, dirs[k % NUM_CLUSTERS], out=row)
        c = rng.standard_normal(3).astype(np.float32)
        row += c[0] * pool[0]
        row += c[1] * pool[1]
        row += c[2] * pool[2]
    del dirs, pool
    return theta0, buf


def _best_of(fn: Callable[[], object], reps: int) -> float:
    best = np.inf
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return best


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


def bench_case(K: int, P_target: int, reps: int, seed: int = 0) -> dict[str, float]:
    """All timings of one (K, P) cell."""
    manifest = synthetic_manifest(P_target)
    P = num_params(manifest)
    theta0, buf = _fill_updates(manifest, K, seed)
    initial = unflatten(theta0, manifest)
    ids = [f"robot_{k:04d}" for k in range(K)]
    stacked = buf.data
    w = np.full(K, 1.0 / K, dtype=np.float32)
    # Millisecond-scale steps get more repeats (best of >= 10, as timeit would): on a shared
    # machine a best of 2 mostly measures the scheduler, not the code.
    fast_reps = max(10, 3 * reps)
    read_pass = _best_of(lambda: w @ stacked, fast_reps)

    fedavg = make_strategy("fedavg")
    fedavg.initialize(initial, ids)
    t_fedavg = _best_of(lambda: fedavg.aggregate_round(0, _updates(buf, K), {}), fast_reps)

    blocks = eligible_blocks(manifest)
    shapes = {s.name: s.shape for s in manifest}
    rng = np.random.default_rng(seed + 1)
    mats = {n: rng.standard_normal(shapes[n], dtype=np.float32) for n in blocks}

    def svds() -> None:
        for _ in range(NUM_CLUSTERS):
            for m in mats.values():
                scipy.linalg.svd(m, full_matrices=False, lapack_driver="gesdd", check_finite=False)

    t_svd = _best_of(svds, 1)
    mats.clear()  # the timed matrices are not needed any more

    drm = make_strategy("feddrman", num_clusters=NUM_CLUSTERS, beta=0.9)
    drm.initialize(initial, ids)
    t_drm = _best_of(lambda: drm.aggregate_round(0, _updates(buf, K), {}), max(1, reps - 1))

    fdp = make_strategy("fedepth", target_overlap=0.2)
    desc = _descriptors(K, seed)
    fdp.initialize(initial, ids)
    t = time.perf_counter()
    fdp.aggregate_round(0, _updates(buf, K), desc)  # round 0: Jeffreys + tau calibration + merge
    t_fedepth_cluster = time.perf_counter() - t
    t_fedepth = _best_of(
        lambda: fdp.aggregate_round(1, _updates(buf, K), {}), fast_reps
    )  # steady-state round

    # Peak memory of the FedDRMan step (traced numpy allocations), updates + state included.
    drm2 = make_strategy("feddrman", num_clusters=NUM_CLUSTERS, beta=0.9)
    drm2.initialize(initial, ids)
    ups = _updates(buf, K)
    gc.collect()
    tracemalloc.start()
    tracemalloc.reset_peak()
    before, _ = tracemalloc.get_traced_memory()
    drm2.aggregate_round(0, ups, {})
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    model_bytes = 4 * P
    peak_models = K + (peak - before) / model_bytes  # K = the updates themselves (in the buffer)
    return {
        "K": K,
        "P": P,
        "read": read_pass,
        "fedavg": t_fedavg,
        "svd": t_svd,
        "feddrman": t_drm,
        "fedepth": t_fedepth,
        "fedepth_cluster": t_fedepth_cluster,
        "peak": peak_models,
        "blocks": len(blocks),
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
        t = time.perf_counter()
        res = cua_scalable(S, C, seed=seed)
        dt = time.perf_counter() - t
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
        f"fed-ros bench aggregate  (C={NUM_CLUSTERS} FedDRMan clusters, beta=0.9, float32; best of "
        f"{reps}, read/FedAvg/FeDepth best of {max(10, 3 * reps)})"
    )
    hdr = (
        f"{'K':>4} {'P':>9} | {'read':>7} {'FedAvg':>7} {'x read':>6} {'<=2':>3} | {'SVD':>7} "
        f"{'FedDRMan':>8} {'x(FA+SVD)':>9} {'<=1.5':>5} | {'FeDepth':>7} {'+clust':>7} | "
        f"{'peak':>6} {'K+3':>5} {'ok':>3}"
    )
    print(hdr)
    print("-" * len(hdr))
    for p in ps:
        for k in ks:
            r = bench_case(k, int(p * 1e6), reps, args.seed)
            fa_ratio = r["fedavg"] / r["read"]
            drm_ratio = r["feddrman"] / (r["fedavg"] + r["svd"])
            ok = lambda c: "yes" if c else "NO"
            print(
                f"{k:>4} {r['P']:>9} | {r['read'] * 1e3:>5.1f}ms {r['fedavg'] * 1e3:>5.1f}ms "
                f"{fa_ratio:>6.2f} {ok(fa_ratio <= 2):>3} | {r['svd'] * 1e3:>5.0f}ms "
                f"{r['feddrman'] * 1e3:>6.0f}ms {drm_ratio:>9.2f} {ok(drm_ratio <= 1.5):>5} | "
                f"{r['fedepth'] * 1e3:>5.1f}ms {r['fedepth_cluster'] * 1e3:>5.0f}ms | "
                f"{r['peak']:>6.2f} {k + 3:>5} {ok(r['peak'] <= k + 3):>3}",
                flush=True,
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
