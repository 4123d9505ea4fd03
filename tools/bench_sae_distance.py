"""Benchmark of the feature-distance computation of genlab.sae_distance: exact EMD (the method), entropic Sinkhorn
(the approximation past the exact solver's size) and the first-moment / decoder-cosine baselines, side by side.

Run: OMP_NUM_THREADS=1 python tools/bench_sae_distance.py [--quick]
Prints pairs per second against the support size N, the reference dimension k and the number of features F, and
Sinkhorn's relative error against exact EMD."""
import argparse
import os
import time

import numpy as np

from genlab.sae_distance import decoder_cosine, distance_matrix, wasserstein


def _measures(rng, F, n, k):
    return [(rng.normal(size=(n, k)), rng.dirichlet(np.ones(n))) for _ in range(F)]


def main(quick: bool = False):
    rng = np.random.default_rng(0)
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
    print("\n[Sinkhorn (eps = 0.05 median cost, log domain) against exact EMD, k = 16]")
    print(f"{'N':>5} {'exact s':>9} {'sinkhorn s':>11} {'rel. error':>11}")
    for n in ((256, 512) if quick else (256, 512, 1024)):
        U, V = rng.normal(size=(n, 16)), rng.normal(size=(n, 16)) + 0.3
        wu, wv = rng.dirichlet(np.ones(n)), rng.dirichlet(np.ones(n))
        t0 = time.perf_counter(); ex = wasserstein(U, wu, V, wv); t_ex = time.perf_counter() - t0
        t0 = time.perf_counter(); sk = wasserstein(U, wu, V, wv, solver="sinkhorn"); t_sk = time.perf_counter() - t0
        print(f"{n:>5} {t_ex:>9.3f} {t_sk:>11.3f} {abs(sk - ex) / ex:>11.4f}")


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    main(ap.parse_args().quick)
