"""Benchmark of the feature-distance computation of genlab.sae_distance: exact EMD (the method), entropic Sinkhorn
(the approximation past the exact solver's size) and the first-moment / decoder-cosine baselines, side by side.

Run: OMP_NUM_THREADS=1 python tools/bench_sae_distance.py [--quick]
Prints pairs per second against the support size N, the reference dimension k and the number of features F, and
the median times of exact EMD and log-domain Sinkhorn side by side per N, Sinkhorn's relative error against exact EMD,
and the crossover (the first N at which Sinkhorn's median time is below exact EMD's) that sets
genlab.sae_distance.SINKHORN_FROM (solver="auto" uses Sinkhorn from that support size on)."""
import argparse
import os
import time

import numpy as np

from genlab.core import np_rng
from genlab.sae_distance import SINKHORN_FROM, decoder_cosine, distance_matrix, wasserstein


def _measures(rng, F, n, k):
    return [(rng.normal(size=(n, k)), rng.dirichlet(np.ones(n))) for _ in range(F)]


def main(quick: bool = False):
    rng = np_rng(0, "bench_sae_distance")
    print(f"threads: OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS')}")
    M = _measures(rng, 2, 16, 4); wasserstein(*M[0], *M[1])  # warm-up (imports, first solver call)
    print("\n[pairs/s against support size N and reference dimension k; 10 x 10 features]")
    print(f"{'N':>5} {'k':>4} {'exact EMD':>12} {'first moment':>14}")
    for k in (16, 32):
        for n in ((32, 64, 128) if quick else (32, 64, 128, 256)):
            M = _measures(rng, 20, n, k)
            t0 = time.perf_counter(); distance_matrix(M[:10], M[10:], "ot"); t_ot = time.perf_counter() - t0
            t0 = time.perf_counter(); distance_matrix(M[:10], M[10:], "mean"); t_m = time.perf_counter() - t0
            print(f"{n:>5} {k:>4} {100 / t_ot:>12.0f} {100 / t_m:>14.0f}")
    print("\n[growth with the number of features F (F x F pairs, N = 64, k = 16)]")
    print(f"{'F':>5} {'pairs':>7} {'exact EMD s':>12} {'decoder cosine s':>17}")
    for F in ((10, 20) if quick else (10, 20, 40)):
        M = _measures(rng, 2 * F, 64, 16)
        t0 = time.perf_counter(); distance_matrix(M[:F], M[F:], "ot"); t_ot = time.perf_counter() - t0
        W = rng.normal(size=(2 * F, 576))
        t0 = time.perf_counter(); decoder_cosine(W[:F], W[F:]); t_d = time.perf_counter() - t0
        print(f"{F:>5} {F * F:>7} {t_ot:>12.3f} {t_d:>17.5f}")
    print("\n[exact EMD against log-domain Sinkhorn (eps = 0.05 median cost), k = 16: median seconds over the runs]")
    print(f"{'N':>5} {'runs':>5} {'exact s':>9} {'sinkhorn s':>11} {'sinkhorn / exact':>17} {'rel. error':>11}")
    sizes = ((256, 3), (512, 3), (1024, 1)) if quick else ((256, 5), (512, 5), (1024, 3), (2048, 1))
    crossover = None
    for n, runs in sizes:
        t_ex, t_sk, err = [], [], []
        for _ in range(runs):
            U, V = rng.normal(size=(n, 16)), rng.normal(size=(n, 16)) + 0.3
            wu, wv = rng.dirichlet(np.ones(n)), rng.dirichlet(np.ones(n))
            t0 = time.perf_counter(); ex = wasserstein(U, wu, V, wv, solver="exact"); t_ex.append(time.perf_counter() - t0)
            t0 = time.perf_counter(); sk = wasserstein(U, wu, V, wv, solver="sinkhorn"); t_sk.append(time.perf_counter() - t0)
            err.append(abs(sk - ex) / ex)
        m_ex, m_sk = float(np.median(t_ex)), float(np.median(t_sk))
        print(f"{n:>5} {runs:>5} {m_ex:>9.3f} {m_sk:>11.3f} {m_sk / m_ex:>17.1f} {float(np.median(err)):>11.4f}", flush=True)
        if crossover is None and m_sk < m_ex:
            crossover = n
    found = f"N = {crossover}" if crossover else f"none up to N = {sizes[-1][0]} (exact EMD is faster at every size)"
    print(f"crossover: {found}; genlab.sae_distance.SINKHORN_FROM = {SINKHORN_FROM}")


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    main(ap.parse_args().quick)
