"""Site kernels against scikit-learn and numpy: one Lloyd iteration and one fuzzy c-means step.

What is timed
-------------
- **Lloyd**: ``fedcluster.common.kernels.lloyd_stats`` (assignment + per-cluster sums,
  counts and SSE) against scikit-learn's own Lloyd iteration, its internal kernel
  ``sklearn.cluster._k_means_lloyd.lloyd_iter_chunked_dense`` (assignment + new centres +
  centre shifts; it uses BLAS GEMM on chunks of 256 rows for the distances). That is what
  ``KMeans(algorithm="lloyd", max_iter=1, n_init=1, init=C).fit`` runs per iteration, without
  the setup (validation, copies, the final relabelling E-step and inertia), which the
  ``KMeans.fit`` column shows for context. scikit-learn runs it under
  ``threadpool_limits(1, "blas")`` with OpenMP threads, exactly as ``KMeans.fit`` does.
- **FCM**: ``fuzzy_kernels.fcm_stats`` (memberships with m = 2, sums of u^m x, u^m totals and
  hard counts) against a numpy step written the fast way (GEMM distances, vectorised
  memberships, ``W.T @ X``) with the same number of BLAS threads.

Both candidates get the same X and initial centres C (k rows of X); they are interleaved
and repeated, and the minimum per candidate is kept, so machine load hits both alike.
Shapes: N x d x k in {100k x 16 x 8, 200k x 64 x 50, 60k x 784 x 20}; the last one is MNIST
(``--data``, pixels scaled to [0, 1]) when the file exists, else random blobs.

GFLOP/s counts 2 N k d per iteration (the multiply-adds of the distance matrix, the
convention of a GEMM) for both candidates. The physical limit is shown two ways: the
measured DGEMM/SGEMM rate (np.dot, 3000 x 3000, same thread count) and a nominal peak from
the clock in /proc/cpuinfo x the FMA width (assumes two FMA pipes of the widest vector unit
the CPU flags advertise).

Usage::

    python bench/kernels.py [--repeats 9] [--threads 1,2] [--dtypes float64,float32] [--out BENCHMARKS.md]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import report  # noqa: E402

import numba  # noqa: E402
from threadpoolctl import threadpool_limits  # noqa: E402

from fedcluster.common import kernels  # noqa: E402
from fedcluster.common.kernels import fuzzy as fuzzy_kernels

SHAPES = ((100_000, 16, 8), (200_000, 64, 50), (60_000, 784, 20))
FUZZIFIER = 2.0


def parse_shape(text: str) -> tuple[int, int, int]:
    n, d, k = (int(v) for v in text.lower().split("x"))
    return n, d, k


def make_data(n: int, d: int, k: int, dtype, mnist: Path | None, seed: int = 0):
    """X (n, d) and starting centres C (k rows of X). MNIST for d = 784 when available."""
    rng = np.random.default_rng(seed)
    if d == 784 and mnist is not None and mnist.exists():
        X = np.load(mnist)["x_train"][:n].astype(dtype) / dtype(255.0)
        source = "MNIST"
    else:
        centres = rng.uniform(-5, 5, size=(k, d))
        X = (centres[rng.integers(k, size=n)] + rng.standard_normal((n, d))).astype(dtype)
        source = "blobs"
    C = X[rng.choice(n, size=k, replace=False)].copy()
    return np.ascontiguousarray(X), C, source


def sklearn_lloyd_iteration(X, C, n_threads: int):
    """A callable running scikit-learn's Lloyd iteration kernel on preallocated buffers."""
    from sklearn.cluster._k_means_lloyd import lloyd_iter_chunked_dense

    n, k = X.shape[0], C.shape[0]
    weights = np.ones(n, dtype=X.dtype)
    centres = np.ascontiguousarray(C, dtype=X.dtype)
    new_centres = np.zeros_like(centres)
    weight_in_clusters = np.zeros(k, dtype=X.dtype)
    labels = np.full(n, -1, dtype=np.int32)
    shift = np.zeros(k, dtype=X.dtype)

    def run():
        with threadpool_limits(limits=1, user_api="blas"):
            lloyd_iter_chunked_dense(X, weights, centres, new_centres, weight_in_clusters,
                                     labels, shift, n_threads)
    return run


def sklearn_fit(X, C):
    from sklearn.cluster import KMeans

    model = KMeans(n_clusters=C.shape[0], algorithm="lloyd", max_iter=1, n_init=1,
                   init=np.asarray(C, dtype=X.dtype))
    return lambda: model.fit(X)


def numpy_fcm_step(X, C, m: float = FUZZIFIER):
    """One fuzzy c-means step in numpy, the fast way: GEMM distances (clipped at 0), Bezdek
    memberships with the exact-hit case, u^m, and the weighted sums by GEMM."""
    D = (np.einsum("ij,ij->i", X, X)[:, None] - 2.0 * (X @ C.T)) + np.einsum("ij,ij->i", C, C)
    np.maximum(D, 0.0, out=D)
    hit = D == 0.0
    with np.errstate(divide="ignore"):
        U = D ** (-1.0 / (m - 1.0))
    if hit.any():
        rows = hit.any(axis=1)
        U[rows] = 0.0
        U[rows, hit[rows].argmax(axis=1)] = 1.0
    U /= U.sum(axis=1, keepdims=True)
    hard = np.bincount(U.argmax(axis=1), minlength=C.shape[0])
    W = U ** m
    return W.T @ X, W.sum(axis=0), hard


def fastest(candidates: dict, repeats: int) -> dict[str, float]:
    """Interleave the candidates `repeats` times (after one warm-up each); minimum seconds."""
    for run in candidates.values():
        run()
    times = {name: [] for name in candidates}
    for _ in range(repeats):
        for name, run in candidates.items():
            t0 = time.perf_counter()
            run()
            times[name].append(time.perf_counter() - t0)
    return {name: min(values) for name, values in times.items()}


def gemm_rate(dtype, threads: int, size: int = 3000) -> float:
    """Measured GEMM GFLOP/s (best of 3) with `threads` BLAS threads: the practical peak."""
    rng = np.random.default_rng(0)
    A = rng.random((size, size)).astype(dtype)
    B = rng.random((size, size)).astype(dtype)
    with threadpool_limits(limits=threads, user_api="blas"):
        np.dot(A, B)
        best = min(_timed(lambda: np.dot(A, B)) for _ in range(3))
    return 2.0 * size**3 / best / 1e9


def _timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def nominal_peak(dtype, threads: int) -> tuple[float, str]:
    """Clock x 2 FMA pipes x lanes x 2 flops, per thread; and how it was derived."""
    mhz, flags = None, set()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("cpu MHz") and mhz is None:
                mhz = float(line.split(":")[1])
            elif line.startswith("flags") and not flags:
                flags = set(line.split(":")[1].split())
    except OSError:
        return float("nan"), "unknown CPU"
    bits = 512 if "avx512f" in flags else 256 if "avx2" in flags else 128
    lanes = bits // (8 * np.dtype(dtype).itemsize)
    ghz = (mhz or float("nan")) / 1000
    return threads * ghz * 2 * lanes * 2, f"{ghz:.2f} GHz x 2 FMA x {bits}-bit"


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--shapes", default=",".join("x".join(map(str, s)) for s in SHAPES),
                        help="comma-separated NxDxK")
    parser.add_argument("--dtypes", default="float64,float32")
    parser.add_argument("--threads", default="1,2", help="Numba / OpenMP / BLAS threads")
    parser.add_argument("--repeats", type=int, default=9, help="timed runs per candidate")
    parser.add_argument("--data", type=Path, default=report.SHARED_DATA / "mnist_uint8.npz",
                        help="MNIST npz (x_train) for the 784-wide shape")
    parser.add_argument("--no-fcm", action="store_true", help="skip the fuzzy c-means table")
    parser.add_argument("--gemm-size", type=int, default=3000,
                        help="matrix size of the GEMM that measures the practical peak")
    parser.add_argument("--out", type=Path, default=None,
                        help="the file to write the section into (e.g. BENCHMARKS.md; "
                        "default: print it only)")
    args = parser.parse_args(argv)
    shapes = [parse_shape(s) for s in args.shapes.split(",")]
    dtypes = [np.dtype(s).type for s in args.dtypes.split(",")]
    thread_counts = [int(t) for t in args.threads.split(",")]
    load_before = os.getloadavg()
    t_start = time.perf_counter()

    peaks = {}
    for dtype in dtypes:
        for threads in thread_counts:
            peaks[dtype, threads] = (gemm_rate(dtype, threads, args.gemm_size),
                                     *nominal_peak(dtype, threads))

    lloyd_rows, fcm_rows = [], []
    for dtype in dtypes:
        for n, d, k in shapes:
            X, C, source = make_data(n, d, k, dtype, args.data)
            flops = 2.0 * n * d * k
            for threads in thread_counts:
                numba.set_num_threads(threads)
                seconds = fastest({
                    "fedcluster": lambda: kernels.lloyd_stats(X, C),
                    "sklearn": sklearn_lloyd_iteration(X, C, threads),
                    "fit": sklearn_fit(X, C),
                }, args.repeats)
                gemm, peak, _ = peaks[dtype, threads]
                ours = flops / seconds["fedcluster"] / 1e9
                lloyd_rows.append(
                    f"| {np.dtype(dtype).name} | {n // 1000}k x {d} x {k} ({source}) | {threads} "
                    f"| {seconds['fedcluster'] * 1e3:.2f} | {seconds['sklearn'] * 1e3:.2f} "
                    f"| **{seconds['fedcluster'] / seconds['sklearn']:.2f}** "
                    f"| {seconds['fit'] * 1e3:.1f} | {ours:.1f} "
                    f"| {flops / seconds['sklearn'] / 1e9:.1f} | {ours / gemm:.0%} | {ours / peak:.0%} |")
                if not args.no_fcm:
                    with threadpool_limits(limits=threads, user_api="blas"):
                        seconds = fastest({
                            "fedcluster": lambda: fuzzy_kernels.fcm_stats(X, C, FUZZIFIER),
                            "numpy": lambda: numpy_fcm_step(X, C),
                        }, max(1, args.repeats // 3))
                    fcm_rows.append(
                        f"| {np.dtype(dtype).name} | {n // 1000}k x {d} x {k} ({source}) | {threads} "
                        f"| {seconds['fedcluster'] * 1e3:.1f} | {seconds['numpy'] * 1e3:.1f} "
                        f"| **{seconds['fedcluster'] / seconds['numpy']:.2f}** |")
                print(lloyd_rows[-1], flush=True)
    numba.set_num_threads(numba.config.NUMBA_NUM_THREADS)
    load_after = os.getloadavg()

    text = [report.header("Kernels: one Lloyd iteration against scikit-learn"), ""]
    text.append(
        f"Minimum of {args.repeats} interleaved runs per candidate (after a warm-up). "
        "ratio = fedcluster / scikit-learn (below 1: fedcluster is faster). scikit-learn = its "
        "Lloyd iteration kernel `lloyd_iter_chunked_dense` (what `KMeans(algorithm=\"lloyd\", "
        "max_iter=1, n_init=1, init=C)` runs, without its setup); `KMeans.fit` = that whole "
        "call, for context (it adds validation, a final E-step and the inertia). GFLOP/s "
        "counts 2 N k d per iteration for both. Load average (1 min) "
        f"{load_before[0]:.2f} before and {load_after[0]:.2f} after the run on "
        f"{os.cpu_count()} cores: other processes shared the machine, which is why each ratio "
        "comes from interleaved runs.\n")
    if np.float32 in dtypes:
        text.append(
            "float32: fedcluster widens float32 data to float64 inside the distance tile (so "
            "labels agree with a float64 reference and the SSE needs no second pass), while "
            "scikit-learn computes float32 distances in float32 with SGEMM: twice the SIMD "
            "lanes per instruction. That, not memory, is what limits the float32 ratio.\n")
    text.append("| dtype | N x d x k | threads | fedcluster ms | scikit-learn ms | ratio "
                "| KMeans.fit ms | fedcluster GFLOP/s | scikit-learn GFLOP/s | of GEMM rate "
                "| of nominal peak |")
    text.append("|---|---|---|---|---|---|---|---|---|---|---|")
    text += lloyd_rows
    text.append("")
    text.append(f"Physical limit, same thread counts: measured GEMM (np.dot {args.gemm_size} x "
                f"{args.gemm_size}) and "
                "nominal peak.\n")
    text.append("| dtype | threads | GEMM GFLOP/s | nominal peak GFLOP/s | nominal from |")
    text.append("|---|---|---|---|---|")
    for (dtype, threads), (gemm, peak, how) in peaks.items():
        text.append(f"| {np.dtype(dtype).name} | {threads} | {gemm:.1f} | {peak:.0f} | {how} |")
    if fcm_rows:
        text += ["", "### Fuzzy c-means step (m = 2) against numpy", "",
                 "numpy = GEMM distances, vectorised memberships and `W.T @ X` with the same "
                 "number of BLAS threads; fedcluster = `fuzzy_kernels.fcm_stats` (exact distances, "
                 "float64 sums, bit-identical for any thread count).", "",
                 "| dtype | N x d x k | threads | fedcluster ms | numpy ms | ratio |",
                 "|---|---|---|---|---|---|", *fcm_rows]
    text.append(f"\nTotal time {time.perf_counter() - t_start:.0f} s.")
    if (path := report.write_section("kernels", "\n".join(text), args.out)) is not None:
        print(f"wrote {path}")


if __name__ == "__main__":
    main()
