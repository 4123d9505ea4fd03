"""genlab against its peers, like with like, printed as one table (never asserted in tests).

Every comparison runs the genlab case and the peer case in the same process, alternately, round after round
(the order flips every round), after one warm-up round of each; the table reports the MEDIAN of the per-round
ratios genlab time / peer time, with their min-max spread: a machine load that rises in one round hits both
cases of that round alike. There is no best-of headline anywhere. Times are this process's CPU time
(time.process_time: the work is single-threaded, OMP_NUM_THREADS=1, so other jobs on the machine hardly enter),
except the notebook rows, which time kernels in other processes by the wall clock. The load average
(os.getloadavg, 1/5/15 min) is printed in every row: the machine may be shared.

A ratio that is impossible by construction (genlab doing a superset of the peer's work yet faster than it, a
capture hook speeding generation up) is printed as `noise`, with its raw median in the note, not as a result.

Peers (each row's note says what differs between the two cases):
  fit / train_cfm     a bare torch loop with the same model, draws, optimiser and schedule; torchcfm 1.0.7
                      (ConditionalFlowMatcher / ExactOptimalTransportConditionalFlowMatcher) for I-CFM and OT-CFM
  OT                  POT (ot.emd, ot.emd2, ot.sinkhorn2, ot.sliced_wasserstein_distance) on the same inputs
  metrics             scipy (the pytorch-fid Frechet formula)
  lm                  transformers' `generate` on the same SmolLM2-135M weights and prompts (greedy)
  shc                 the project's own fused-einsum rewrite of the official sHC formulation (6zHAOyi/s2HC is not
                      a package); it is a reference written here, not the official code
  runs                papermill.execute_notebook on the same trivial notebook
  workers             4 notebook runs on 2 vs 1 local workers (skipped when the rest took over 5 min)

Run: OMP_NUM_THREADS=1 python tools/bench.py [section ...]   (default: all; `make bench`)
"""
import argparse
import contextlib
import copy
import json
import math
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
import torch

ROOT = Path(__file__).resolve().parent.parent
clock = time.process_time   # this process's CPU time: single-threaded work, so other jobs' load hardly enters
TOL = 0.03          # a median ratio below 1 - TOL where genlab does a superset of the peer's work is impossible: noise
UNSTABLE = 1.5      # a max/min spread of the per-round ratios above this is flagged as unstable under load


# ---------------------------------------------------------------- pure helpers (tests/test_bench.py)

def round_ratios(num: list[float], den: list[float]) -> list[float]:
    "Per-round ratios num[i] / den[i] of two interleaved timing series of equal length."
    if len(num) != len(den) or not num:
        raise ValueError(f"need two equal, non-empty timing series; got {len(num)} and {len(den)}")
    if any(d <= 0 for d in den) or any(n < 0 for n in num):
        raise ValueError("timings must be positive")
    return [n / d for n, d in zip(num, den)]


def summarize(ratios: list[float]) -> tuple[float, float, float]:
    "(median, min, max) of the per-round ratios."
    if not ratios:
        raise ValueError("no ratios")
    return statistics.median(ratios), min(ratios), max(ratios)


def judge(ratios: list[float], expect: str | None = None, tol: float = TOL, unstable: float = UNSTABLE):
    """(ratio cell, flag) for per-round ratios genlab / peer.

    expect='ge1': genlab does a superset of the peer's work (the same work plus bookkeeping, or plus a hook), so a
    median below 1 - tol cannot be real: the cell reads 'noise' and the flag says so with the raw median.
    expect='le1': the reverse (genlab does a subset). A spread max/min above `unstable` is flagged too."""
    if expect not in (None, "ge1", "le1"):
        raise ValueError(f"expect must be None, 'ge1' or 'le1'; got {expect!r}")
    med, lo, hi = summarize(ratios)
    flags = []
    cell = f"{med:.2f}x"
    if (expect == "ge1" and med < 1 - tol) or (expect == "le1" and med > 1 + tol):
        side = "faster" if expect == "ge1" else "slower"
        what = "a superset" if expect == "ge1" else "a subset"
        cell = "noise"
        flags.append(f"NOISE: raw median {med:.2f}x, genlab does {what} of the peer's work yet ran {side}: not a result")
    if lo > 0 and hi / lo > unstable:
        flags.append(f"unstable: spread {hi / lo:.2f}x > {unstable}x under load")
    return cell, "; ".join(flags)


def interleave(cases: dict, rounds: int, warmup: int = 1) -> dict[str, list[float]]:
    "Run each case (a no-argument callable returning its own seconds) `warmup` times, then `rounds` rounds, order flipped every round."
    names = list(cases)
    for _ in range(warmup):
        for n in names:
            cases[n]()
    times = {n: [] for n in names}
    for r in range(rounds):
        for n in (names if r % 2 == 0 else names[::-1]):
            times[n].append(float(cases[n]()))
    return times


def fmt_time(seconds: float, per: int = 1, unit: str = "") -> str:
    "Median seconds per unit of work, in s / ms / us."
    s = seconds / per
    text = f"{s:.2f} s" if s >= 1 else f"{1e3 * s:.2f} ms" if s >= 1e-3 else f"{1e6 * s:.1f} us"
    return text + (f"/{unit}" if unit else "")


def load_text() -> str:
    return "load " + "/".join(f"{x:.1f}" for x in os.getloadavg())


ROWS: list[dict] = []


def add_row(work, genlab, peer, t_gen, t_peer, *, per=1, unit="", expect=None, note=""):
    "Record one table row from two interleaved timing series (seconds per round)."
    ratios = round_ratios(t_gen, t_peer)
    cell, flag = judge(ratios, expect)
    _, lo, hi = summarize(ratios)
    ROWS.append({"work": work, "genlab": f"{genlab} {fmt_time(statistics.median(t_gen), per, unit)}",
                 "peer": f"{peer} {fmt_time(statistics.median(t_peer), per, unit)}", "ratio": cell,
                 "spread": f"{lo:.2f}-{hi:.2f} (n={len(ratios)})",
                 "note": "; ".join(x for x in (flag, note, load_text()) if x)})


def table(rows: list[dict]) -> str:
    "The final markdown table."
    head = ["work", "genlab", "peer", "median ratio", "min-max spread", "note"]
    keys = ["work", "genlab", "peer", "ratio", "spread", "note"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(str(r[k]).replace("|", "/") for k in keys) + " |" for r in rows]
    return "\n".join(lines)


def say(*a):
    print(*a, file=sys.stderr, flush=True)


def timed(f, wall: bool = False):
    "Seconds that f() takes: this process's CPU time, or the wall clock (work in other processes: notebook kernels)."
    c = time.perf_counter if wall else clock
    t0 = c()
    f()
    return c() - t0


# ---------------------------------------------------------------- training loops

def _cfm_setup(steps, dim=2, n_data=20_000):
    from genlab.flow_matching import VelocityMLP
    data = torch.randn(n_data, dim, generator=torch.Generator().manual_seed(0)) * 0.5 + 3
    init = VelocityMLP(dim, 64, 3, generator=torch.Generator().manual_seed(1))
    return data, init


def bench_fit(steps=100, rounds=11):
    "genlab.train.fit vs a bare Adam loop calling the same loss closure on the same pre-drawn batches."
    from genlab.train import fit
    g = torch.Generator().manual_seed(0)
    X0, X1, T = torch.randn(steps, 256, 2, generator=g), torch.randn(steps, 256, 2, generator=g) + 3, torch.rand(steps, 256, generator=g)
    _, init = _cfm_setup(steps)

    def loss(m, i):
        xt = (1 - T[i, :, None]) * X0[i] + T[i, :, None] * X1[i]
        return (m(T[i], xt) - (X1[i] - X0[i])).pow(2).sum(1).mean()

    def bare():
        m = copy.deepcopy(init); opt = torch.optim.Adam(m.parameters(), 1e-3)
        t0 = clock()
        for i in range(steps):
            opt.zero_grad(set_to_none=True); loss(m, i).backward(); opt.step()
        return clock() - t0

    def ours():
        m = copy.deepcopy(init)
        t0 = clock()
        fit(lambda i: {"cfm": loss(m, i)}, m.parameters(), steps=steps, lr=1e-3, progress=False)
        return clock() - t0

    t = interleave({"fit": ours, "bare": bare}, rounds)
    add_row("training loop: Adam, MLP 3x64, batch 256", "genlab.train.fit", "bare torch loop", t["fit"], t["bare"],
            per=steps, unit="step", expect="ge1",
            note="same closure and batches; fit adds float(loss), the finite check and the History (a superset)")


def _bare_cfm(init, data, steps, bs, seed, coupling="independent"):
    "The loop train_cfm runs, written out: the same generator and draw order (x1 index, x0, t), Adam, cosine schedule."
    from genlab.flow_matching import ot_coupling
    m = copy.deepcopy(init); opt = torch.optim.Adam(m.parameters(), 1e-3)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=steps, eta_min=0.0)
    gen = torch.Generator().manual_seed(seed)
    t0 = clock()
    for _ in range(steps):
        x1 = data[torch.randint(0, len(data), (bs,), generator=gen)]
        x0 = torch.randn(bs, data.shape[1], generator=gen)
        if coupling == "ot":
            x0, x1 = ot_coupling(x0, x1)
        t = torch.rand(bs, generator=gen)
        xt = (1 - t[:, None]) * x0 + t[:, None] * x1
        loss = (m(t, xt) - (x1 - x0)).pow(2).sum(1).mean()
        opt.zero_grad(set_to_none=True); loss.backward(); opt.step(); sched.step()
    return clock() - t0, m


def _genlab_cfm(init, data, steps, bs, seed, coupling="independent"):
    from genlab.flow_matching import train_cfm
    m = copy.deepcopy(init)
    t0 = clock()
    train_cfm(m, lambda n, gen: data[torch.randint(0, len(data), (n,), generator=gen)], coupling=coupling, steps=steps,
              batch_size=bs, lr=1e-3, generator=torch.Generator().manual_seed(seed), progress=False)
    return clock() - t0, m


def _torchcfm_loop(init, data, steps, bs, seed, fm):
    "torchcfm's README loop: x0 ~ N(0, I), x1 from the data, t/xt/ut from the matcher, loss mean((v - u)^2); Adam, cosine."
    m = copy.deepcopy(init); opt = torch.optim.Adam(m.parameters(), 1e-3)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=steps, eta_min=0.0)
    gen = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    t0 = clock()
    for _ in range(steps):
        x1 = data[torch.randint(0, len(data), (bs,), generator=gen)]
        x0 = torch.randn(bs, data.shape[1], generator=gen)
        t, xt, ut = fm.sample_location_and_conditional_flow(x0, x1)
        loss = torch.mean((m(t, xt) - ut) ** 2)
        opt.zero_grad(set_to_none=True); loss.backward(); opt.step(); sched.step()
    return clock() - t0


@torch.no_grad()
def _max_param_diff(a, b) -> float:
    return max(float((p - q).abs().max()) for p, q in zip(a.parameters(), b.parameters()))


def bench_cfm(steps=100, ot_steps=30, rounds=11, ot_rounds=9, bs=256):
    "I-CFM and OT-CFM training steps: train_cfm vs the same loop written out, and vs torchcfm."
    try:
        from torchcfm.conditional_flow_matching import ConditionalFlowMatcher, ExactOptimalTransportConditionalFlowMatcher
    except ImportError:   # tools/install.sh installs it; without it the torchcfm rows are left out, and say so
        say("torchcfm is not installed (tools/install.sh installs it): the torchcfm rows are left out")
        ConditionalFlowMatcher = ExactOptimalTransportConditionalFlowMatcher = None
    data, init = _cfm_setup(steps)
    _, m_g = _genlab_cfm(init, data, 50, bs, 7)
    _, m_b = _bare_cfm(init, data, 50, bs, 7)
    same = _max_param_diff(m_g, m_b)
    cases = {"genlab": lambda: _genlab_cfm(init, data, steps, bs, 3)[0], "bare": lambda: _bare_cfm(init, data, steps, bs, 3)[0]}
    if ConditionalFlowMatcher is not None:
        fm = ConditionalFlowMatcher(sigma=0.0)
        cases["torchcfm"] = lambda: _torchcfm_loop(init, data, steps, bs, 3, fm)
    t = interleave(cases, rounds)
    add_row(f"I-CFM training step (2-d, MLP 3x64, batch {bs})", "train_cfm", "bare loop, same draws", t["genlab"], t["bare"],
            per=steps, unit="step", expect="ge1",
            note=f"same generator, draws, Adam and cosine schedule; weights after 50 steps differ by {same:.1e} "
                 "(identical work); train_cfm adds fit's logging (a superset)")
    if ConditionalFlowMatcher is None:
        return
    add_row(f"I-CFM training step (2-d, MLP 3x64, batch {bs})", "train_cfm", "torchcfm ConditionalFlowMatcher", t["genlab"],
            t["torchcfm"], per=steps, unit="step",
            note="torchcfm draws t from the global RNG and an unused noise tensor at sigma=0, takes the element mean "
                 "(loss/2 here), logs nothing; same net, data, Adam, cosine")
    ot_fm = ExactOptimalTransportConditionalFlowMatcher(sigma=0.0)
    ot_fm.ot_sampler.ot_fn.keywords["numThreads"] = 1
    t = interleave({"genlab": lambda: _genlab_cfm(init, data, ot_steps, bs, 3, "ot")[0],
                    "bare": lambda: _bare_cfm(init, data, ot_steps, bs, 3, "ot")[0],
                    "torchcfm": lambda: _torchcfm_loop(init, data, ot_steps, bs, 3, ot_fm)}, ot_rounds)
    add_row(f"OT-CFM training step (exact minibatch OT, batch {bs})", "train_cfm(coupling='ot')", "bare loop, same draws",
            t["genlab"], t["bare"], per=ot_steps, unit="step", expect="ge1",
            note="the written-out loop calls the same ot_coupling; train_cfm adds fit's logging (a superset)")
    add_row(f"OT-CFM training step (exact minibatch OT, batch {bs})", "train_cfm(coupling='ot')",
            "torchcfm ExactOptimalTransportCFM", t["genlab"], t["torchcfm"], per=ot_steps, unit="step",
            note="both solve ot.emd on squared distances; genlab: float64 cost, the plan's argmax (a permutation); "
                 "torchcfm: float32 cost, a check of the plan, then np.random.choice of b pairs from the plan")


# ---------------------------------------------------------------- OT and metrics

def bench_ot(rounds=7, calls=20):
    "genlab's OT uses against POT called directly on the same inputs."
    import numpy as np
    import ot
    from genlab.flow_matching import ot_plan_index, exact_ot_cost
    from genlab.sae_distance import wasserstein
    g = torch.Generator().manual_seed(0)
    x0, x1 = torch.randn(256, 2, generator=g), torch.randn(256, 2, generator=g) + 3
    w = np.full(256, 1 / 256)
    a0, a1 = x0.double().numpy(), x1.double().numpy()

    def gen_plan():
        return timed(lambda: [ot_plan_index(x0, x1) for _ in range(calls)])

    def pot_plan():
        return timed(lambda: [ot.emd(w, w, ot.dist(a0, a1)).argmax(1) for _ in range(calls)])

    t = interleave({"g": gen_plan, "p": pot_plan}, rounds)
    assert torch.equal(ot_plan_index(x0, x1), torch.as_tensor(ot.emd(w, w, ot.dist(a0, a1)).argmax(1)))
    add_row("minibatch OT plan, b = 256, d = 2 (OT-CFM pairing)", "flow_matching.ot_plan_index", "POT ot.emd + argmax",
            t["g"], t["p"], per=calls, unit="call", note="same pairing, same cost (ot.dist, float64); genlab adds the tensor round trip")
    y0, y1 = torch.randn(1000, 2, generator=g), torch.randn(1000, 2, generator=g) + 3
    b0, b1, w1 = y0.double().numpy(), y1.double().numpy(), np.full(1000, 1e-3)
    t = interleave({"g": lambda: timed(lambda: exact_ot_cost(y0, y1)),
                    "p": lambda: timed(lambda: ot.emd2(w1, w1, ot.dist(b0, b1), numItermax=10_000_000))}, 5)
    add_row("exact W2^2, n = 1000, d = 2 (flow_matching evaluation)", "flow_matching.exact_ot_cost", "POT ot.emd2",
            t["g"], t["p"], note="same solver, iteration cap and cost (ot.dist, float64)")
    rs = np.random.default_rng(0)
    U, V = rs.normal(size=(256, 16)), rs.normal(size=(256, 16)) + 0.3
    wu, wv = rs.dirichlet(np.ones(256)), rs.dirichlet(np.ones(256))
    C = ot.dist(U, V)
    eps = 0.05 * float(np.median(C))
    t = interleave({"g": lambda: timed(lambda: wasserstein(U, wu, V, wv)),
                    "p": lambda: timed(lambda: ot.emd2(wu, wv, ot.dist(U, V), numItermax=1_000_000)),
                    "s": lambda: timed(lambda: ot.sinkhorn2(wu, wv, ot.dist(U, V), eps, method="sinkhorn_log", numItermax=2000))},
                   rounds)
    exact, sk = wasserstein(U, wu, V, wv, solver="exact"), wasserstein(U, wu, V, wv, solver="sinkhorn")
    add_row("feature distance W2, N = 256, k = 16 (sae_distance)", "sae_distance.wasserstein (auto)", "POT ot.emd2",
            t["g"], t["p"], expect="ge1", note="auto = exact EMD at this N; genlab adds the weight normalisation and sqrt (a superset)")
    add_row("feature distance W2, N = 256, k = 16 (sae_distance)", "sae_distance.wasserstein (auto)",
            "POT ot.sinkhorn2 (log domain)", t["g"], t["s"],
            note=f"the solver genlab does not pick at this N: eps = 0.05 median cost, <= 2000 iterations, "
                 f"{100 * abs(sk - exact) / exact:.1f}% off the exact W2")


def bench_metrics(rounds=7, calls=2):
    "genlab.metrics against POT and scipy."
    import numpy as np
    import ot
    import scipy.linalg
    from genlab.metrics import frechet_distance, sliced_w2
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(2048, 8, generator=g), torch.randn(2048, 8, generator=g) + 0.5
    xn, yn = x.double().numpy(), y.double().numpy()
    t = interleave({"g": lambda: timed(lambda: [sliced_w2(x, y, 256, torch.Generator().manual_seed(1)) for _ in range(calls)]),
                    "p": lambda: timed(lambda: [ot.sliced_wasserstein_distance(xn, yn, n_projections=256, seed=1)
                                                for _ in range(calls)])}, rounds)
    add_row("sliced W2, n = 2048, d = 8, 256 directions", "metrics.sliced_w2", "POT ot.sliced_wasserstein_distance",
            t["g"], t["p"], per=calls, unit="call",
            note="both project, sort and average; directions from torch vs numpy (different draws); genlab float64 torch")
    fx, fy = torch.randn(2000, 64, generator=g), torch.randn(2000, 64, generator=g) * 1.1

    def fid_scipy():   # pytorch-fid's calculate_frechet_distance on statistics computed with numpy
        a, b = fx.double().numpy(), fy.double().numpy()
        mu1, mu2, s1, s2 = a.mean(0), b.mean(0), np.cov(a, rowvar=False), np.cov(b, rowvar=False)
        covmean = scipy.linalg.sqrtm(s1.dot(s2))   # pytorch-fid passes disp=False, deprecated in this scipy
        if not np.isfinite(covmean).all():
            off = np.eye(s1.shape[0]) * 1e-6
            covmean = scipy.linalg.sqrtm((s1 + off).dot(s2 + off))
        covmean = covmean.real
        return float((mu1 - mu2).dot(mu1 - mu2) + np.trace(s1) + np.trace(s2) - 2 * np.trace(covmean))

    t = interleave({"g": lambda: timed(lambda: frechet_distance(fx, fy)), "p": lambda: timed(fid_scipy)}, rounds)
    add_row("Frechet distance, 2 x 2000 features, k = 64", "metrics.frechet_distance", "pytorch-fid formula (scipy sqrtm)",
            t["g"], t["p"], note=f"same scipy.linalg.sqrtm; values differ by {abs(frechet_distance(fx, fy) - fid_scipy()):.1e}")


# ---------------------------------------------------------------- language model

LM_PROMPTS = ["Write a short sentence about the sea.", "What is the capital of France?",
              "Name three colours of the rainbow and say which one you like best.", "Explain rain to a child.",
              "Give me a tip for learning to cook pasta at home on a weekday evening.", "Say hello.",
              "What do bees make?", "Describe a quiet morning in a small mountain village in two sentences."]


def bench_lm(new_tokens=12, rounds=4):
    "SmolLM2-135M greedy generation: the genlab handle vs transformers' generate on the same model; hook overhead."
    from genlab.lm import load_smollm2
    t0 = time.perf_counter()
    h = load_smollm2()
    load_s = time.perf_counter() - t0
    tok = h.tokenizer
    pad = h.pad_id
    prompts = {1: h.chat_prompt(LM_PROMPTS[:1]), 8: h.chat_prompt(LM_PROMPTS)}   # Batch(ids, attention_mask), left-padded

    def ours(b, hook=False):
        p = prompts[b]
        with h.capture([10, 20]) if hook else contextlib.nullcontext():
            t0 = clock()
            out = h.generate(p, max_new_tokens=new_tokens)
            return clock() - t0, out

    def hf(b):
        p = prompts[b]
        t0 = clock()
        with torch.no_grad():
            out = h.model.generate(input_ids=p.ids, attention_mask=p.attention_mask, max_new_tokens=new_tokens,
                                   do_sample=False, pad_token_id=pad, eos_token_id=h.eos_id)
        return clock() - t0, out

    same = {}
    for b in (1, 8):
        a, c = ours(b)[1], hf(b)[1]
        same[b] = (a.shape == c.shape and bool(torch.equal(a, c)), a.shape[1] - prompts[b].ids.shape[1])
    cases = {f"{who}{b}": (lambda who=who, b=b: (ours(b) if who == "g" else ours(b, True) if who == "k" else hf(b))[0])
             for b in (1, 8) for who in ("g", "h", "k") if not (who == "k" and b == 8)}
    t = interleave(cases, rounds, warmup=0)   # the token check above was the warm-up of both generators
    del tok
    for b in (1, 8):
        ident, n = same[b]
        add_row(f"SmolLM2-135M greedy generation, batch {b}, <= {new_tokens} new tokens", "LMHandle.generate",
                "transformers generate", t[f"g{b}"], t[f"h{b}"],
                note=f"same model object, prompts and stopping at EOS; tokens identical: {ident} ({n} new); "
                     f"transformers adds its logits processors and stopping criteria, genlab its own loop")
    add_row("capture hook on 2 layers, batch 1", "generate + capture", "generate, no hook", t["k1"], t["g1"],
            expect="ge1", note="the hook is extra work: a ratio below 1 is noise")
    thr = [t["g1"][i] * 8 / t["g8"][i] for i in range(rounds)]
    ROWS[-2]["note"] += (f"; batch-8 throughput = {statistics.median(thr):.2f}x batch 1 (median; "
                         f"{min(thr):.2f}-{max(thr):.2f}); model load from the cache {load_s:.1f} s")


# ---------------------------------------------------------------- sHC

def bench_shc(batch=8, tokens=256, C=64, n=4, rounds=30):
    "sHC sublayer forward + backward: genlab's HyperConnection vs the project's fused-einsum rewrite of the official formulation."
    import torch.nn.functional as F
    from genlab.shc import HyperConnection
    g = torch.Generator().manual_seed(0)
    hc = HyperConnection(n, C, "shc", 1)
    with torch.no_grad():                       # a generic point, away from the identity init
        for p in hc.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=g))
    lin = torch.nn.Linear(C, C)
    X = torch.randn(batch, tokens, n, C, generator=g, requires_grad=True)
    W = hc.dynamic.weight.detach()
    ref = {"pre": torch.nn.Linear(n * C, n, bias=False), "post": torch.nn.Linear(n * C, n, bias=False),
           "res": torch.nn.Linear(n * C, (n - 1) ** 2, bias=False)}
    with torch.no_grad():
        ref["pre"].weight.copy_(W[:n]); ref["post"].weight.copy_(W[n:2 * n]); ref["res"].weight.copy_(W[2 * n:])
    m, k = n - 1, (n - 1) * (n - 2) // 2
    iu = torch.triu_indices(m, m, 1)
    U = torch.zeros(n, m, dtype=torch.float64)   # the Helmert basis, built in float64
    for i in range(1, n):
        U[:i, i - 1] = 1 / math.sqrt(i * (i + 1)); U[i, i - 1] = -i / math.sqrt(i * (i + 1))
    U, I = U.float(), torch.eye(m)

    def reference_fused(Xs):   # separate coefficient projections, linalg.solve Cayley maps, one einsum
        v = Xs.flatten(-2)
        xbar = F.normalize(v, dim=-1, eps=1e-6) * math.sqrt(v.shape[-1]) * (1 + hc.norm_gain)
        a = torch.sigmoid(hc.scale_pre * ref["pre"](xbar) + hc.static_pre)
        b = 2 * torch.sigmoid(hc.scale_post * ref["post"](xbar) + hc.static_post)
        r = ref["res"](xbar)
        zU = hc.gamma_U * torch.tanh(hc.scale_U * r[..., :k] + hc.static_U)
        zV = hc.gamma_V * torch.tanh(hc.scale_V * r[..., k:2 * k] + hc.static_V)
        sig = torch.tanh(hc.scale_sigma * r[..., 2 * k:] + hc.static_sigma)
        AU = zU.new_zeros(*zU.shape[:-1], m, m); AU[..., iu[0], iu[1]] = zU; AU = AU - AU.transpose(-1, -2)
        AV = zV.new_zeros(*zV.shape[:-1], m, m); AV[..., iu[0], iu[1]] = zV; AV = AV - AV.transpose(-1, -2)
        QU, QV = torch.linalg.solve(I + AU, I - AU), torch.linalg.solve(I + AV, I - AV)
        H = 1.0 / n + U @ (QU @ (sig[..., :, None] * QV.transpose(-1, -2))) @ U.T
        mix = torch.einsum("...sk,...sc->...kc", torch.cat([a[..., None], H], -1), Xs)
        return mix[..., 1:, :] + b[..., None] * lin(mix[..., 0, :])[..., None, :]

    y0, y1 = hc(X, lin), reference_fused(X)
    g0, = torch.autograd.grad(y0.square().sum(), X)
    g1, = torch.autograd.grad(y1.square().sum(), X)
    diff = float((y0 - y1).detach().abs().max()); gdiff = float((g0 - g1).abs().max() / g0.abs().max())

    def step(f):
        def run():
            t0 = clock()
            f(X).square().sum().backward()
            dt = clock() - t0
            X.grad = None; hc.zero_grad(set_to_none=True); lin.zero_grad(set_to_none=True)
            for mod in ref.values():
                mod.zero_grad(set_to_none=True)
            return dt
        return run

    t = interleave({"g": step(lambda Xs: hc(Xs, lin)), "r": step(reference_fused)}, rounds, warmup=2)
    add_row(f"sHC sublayer fwd+bwd, {batch}x{tokens} tokens, C = {C}, n = {n}, float32", "shc.HyperConnection",
            "project's fused-einsum rewrite of the official sHC (not the official code)", t["g"], t["r"],
            note=f"outputs differ by {diff:.1e} (max abs), input gradients by {gdiff:.1e} of their max (genlab: closed-form adjugate "
                 "inverse; rewrite: LU solve); the official 6zHAOyi/s2HC code is no package")


# ---------------------------------------------------------------- papermill and workers

def _trivial_nb(work_s: float) -> dict:
    src = f"import time\nt = time.process_time()\nwhile time.process_time() - t < {work_s}:\n    pass"
    return {"cells": [{"cell_type": "code", "id": "p", "metadata": {"tags": ["parameters"]}, "outputs": [],
                       "execution_count": None, "source": "x = 1"},
                      {"cell_type": "code", "id": "c", "metadata": {}, "outputs": [], "execution_count": None, "source": src}],
            "metadata": {"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}},
            "nbformat": 4, "nbformat_minor": 5}


def bench_runs(rounds=4):
    "A trivial notebook through genlab.runs.execute_point vs papermill.execute_notebook directly (wall clock)."
    import logging
    import papermill as pm
    from genlab.runs import execute_point, make_point
    logging.getLogger("papermill").setLevel(logging.ERROR)
    with tempfile.TemporaryDirectory() as d:
        d = Path(d)
        p = d / "trivial.ipynb"; p.write_text(json.dumps(_trivial_nb(0.0)))
        t = interleave({"g": lambda: timed(lambda: execute_point(make_point(p, {})), wall=True),
                        "p": lambda: timed(lambda: pm.execute_notebook(str(p), str(d / "out.ipynb"), kernel_name="python3",
                                                                      progress_bar=False, cwd=str(d)), wall=True)}, rounds)
    add_row("run a trivial notebook (kernel start to end, wall clock)", "runs.execute_point", "papermill.execute_notebook",
            t["g"], t["p"], expect="ge1", note="genlab runs papermill plus the record, a temporary folder, the kernel log "
            "and the stall watch (a superset); its kernel talks over IPC sockets, plain papermill's over TCP")


def bench_workers(rounds=2, points=4, work_s=2.0):
    "4 notebook runs on 2 vs 1 local workers (wall clock)."
    from genlab.runs import make_point, run_points
    with tempfile.TemporaryDirectory() as d:
        d = Path(d)
        q = d / "busy.ipynb"; q.write_text(json.dumps(_trivial_nb(work_s)))
        k = iter(range(10 ** 6))

        def pool(w):
            pts = [make_point(q, {"x": next(k)}) for _ in range(points)]
            return timed(lambda: run_points(pts, d / f"w{w}-{pts[0]['id']}", workers=w, progress=False), wall=True)

        t = interleave({"w2": lambda: pool(2), "w1": lambda: pool(1)}, rounds, warmup=0)
    add_row(f"{points} notebook runs of {work_s:g} s CPU each (wall clock)", "run_points, 2 workers", "run_points, 1 worker",
            t["w2"], t["w1"], note=f"ideal 0.5 on 2 idle cores; with 2 workers the pool first spawns 2 processes that import genlab "
                 f"(torch), and each run starts its own kernel; {os.cpu_count()} cores, shared")


SECTIONS = {"fit": bench_fit, "cfm": bench_cfm, "ot": bench_ot, "metrics": bench_metrics, "lm": bench_lm,
            "shc": bench_shc, "runs": bench_runs, "workers": bench_workers}
DEFAULT = ["fit", "cfm", "ot", "metrics", "lm", "shc", "runs", "workers"]
WORKERS_IF_UNDER = 300   # seconds: the default run does `workers` (about a minute idle, minutes loaded) only if the rest took less


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("sections", nargs="*", help=f"any of {list(SECTIONS)} (default: {DEFAULT})")
    args = ap.parse_args(argv)
    bad = [s for s in args.sections if s not in SECTIONS]
    if bad:
        ap.error(f"unknown section(s) {bad}; allowed: {list(SECTIONS)}")
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    t_all = time.perf_counter()
    head = (f"genlab bench: torch {torch.__version__}, {torch.get_num_threads()} thread(s), {os.cpu_count()} cores, "
            f"{load_text()} at start (1/5/15 min; the machine is shared)")
    skipped = []
    for name in args.sections or DEFAULT:
        if name == "workers" and not args.sections and time.perf_counter() - t_all > WORKERS_IF_UNDER:
            skipped.append(f"workers (the rest took over {WORKERS_IF_UNDER} s; run tools/bench.py workers)")
            continue
        t0 = time.perf_counter()
        say(f"[{name}] ...")
        SECTIONS[name]()
        say(f"[{name}] {time.perf_counter() - t0:.0f} s, {load_text()}")
    print(head)
    print("ratio = genlab time / peer time per round (< 1: genlab faster); median and min-max over interleaved rounds "
          "after a warm-up; times = this process's CPU time (single-threaded), wall clock for notebook runs; "
          "'noise' = impossible by construction (see note)\n")
    print(table(ROWS))
    print(f"\ntotal {time.perf_counter() - t_all:.0f} s wall, {load_text()} at end"
          + "".join(f"; not run: {x}" for x in skipped))


if __name__ == "__main__":
    main()
