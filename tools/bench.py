"""Performance figures for the shared core (printed, never asserted in tests).

1. `fit` against a bare torch loop on the same model, batch and pre-drawn data; `cfm`: I-CFM training
   through `genlab.flow_matching.train_cfm` against a bare torch loop on the same pre-drawn data.
2. papermill: kernel start to first cell, and 4 independent runs on 1 vs 2 local workers.
3. lm (SmolLM2-135M): load from the cache, greedy tokens/s at batch 1 and batch 8 with and without a capture hook.
4. shc: forward + backward of one sHC hyper-connection sublayer (8 x 256 tokens, C = 64, n = 4, float32) for
   genlab's module, a fused-einsum reference of the same computation written the way the official code is
   (separate coefficient projections, `torch.linalg.solve` Cayley maps, one einsum for the pre-weights and the
   residual mix) and the two-step formulation (branch input and H^T X as separate contractions); outputs and
   gradients are checked identical first.
"""
import contextlib
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
import torch

ROOT = Path(__file__).resolve().parent.parent


def bench_fit(steps=2000, repeats=3):
    from genlab.flow_matching import VelocityMLP
    from genlab.train import fit
    g = torch.Generator().manual_seed(0)
    x0 = torch.randn(steps, 256, 2, generator=g)
    x1 = torch.randn(steps, 256, 2, generator=g) + 3
    t = torch.rand(steps, 256, generator=g)

    def loss(m, i):
        xt = (1 - t[i, :, None]) * x0[i] + t[i, :, None] * x1[i]
        return (m(t[i], xt) - (x1[i] - x0[i])).pow(2).sum(1).mean()

    bare, ours = [], []
    for _ in range(repeats):
        torch.manual_seed(0); m = VelocityMLP(2, 64, 3); opt = torch.optim.Adam(m.parameters(), 1e-3)
        t0 = time.perf_counter()
        for i in range(steps):
            opt.zero_grad(set_to_none=True); l = loss(m, i); l.backward(); opt.step()
        bare.append(time.perf_counter() - t0)
        torch.manual_seed(0); m = VelocityMLP(2, 64, 3)
        t0 = time.perf_counter()
        fit(lambda i: {"cfm": loss(m, i)}, m.parameters(), steps=steps, lr=1e-3, progress=True)
        ours.append(time.perf_counter() - t0)
    b, o = min(bare), min(ours)
    print(f"fit vs bare loop ({steps} steps, MLP 3x64, batch 256, best of {repeats}): "
          f"bare {steps / b:.0f} steps/s, fit {steps / o:.0f} steps/s, overhead {100 * (o / b - 1):+.1f}%")


def bench_cfm(steps=1500, repeats=5):
    "I-CFM training: train_cfm (fit, cosine schedule, its own x0/t draws) vs a bare torch loop, same net, batch, data."
    from genlab.flow_matching import VelocityMLP, train_cfm
    g = torch.Generator().manual_seed(0)
    X1 = torch.randn(steps, 256, 2, generator=g) + 3
    X0 = torch.randn(steps, 256, 2, generator=g)
    T = torch.rand(steps, 256, generator=g)

    def bare():
        torch.manual_seed(0); m = VelocityMLP(2, 64, 3); opt = torch.optim.Adam(m.parameters(), 1e-3)
        t0 = time.perf_counter()
        for i in range(steps):
            t, x0, x1 = T[i], X0[i], X1[i]
            xt = (1 - t[:, None]) * x0 + t[:, None] * x1
            loss = (m(t, xt) - (x1 - x0)).pow(2).sum(1).mean()
            opt.zero_grad(set_to_none=True); loss.backward(); opt.step()
        return steps / (time.perf_counter() - t0)

    def ours():
        torch.manual_seed(0); m = VelocityMLP(2, 64, 3)
        it = iter(range(10 ** 9))
        t0 = time.perf_counter()
        train_cfm(m, lambda n, gen: X1[next(it) % steps], steps=steps, batch_size=256,
                  generator=torch.Generator().manual_seed(1), progress=False)
        return steps / (time.perf_counter() - t0)

    b, o = [], []
    for _ in range(repeats):   # interleaved, so both see the same machine load
        b.append(bare()); o.append(ours())
    print(f"I-CFM training ({steps} steps, MLP 3x64 SiLU, batch 256, 1 thread, best of {repeats} interleaved): "
          f"bare loop {max(b):.0f} steps/s, train_cfm {max(o):.0f} steps/s, ratio {max(o) / max(b):.2f}x "
          f"(medians {statistics.median(b):.0f} vs {statistics.median(o):.0f})")


def bench_papermill():
    from genlab.runs import execute_point, make_point, run_points
    import json
    nb = {"cells": [{"cell_type": "code", "id": "p", "metadata": {"tags": ["parameters"]}, "outputs": [],
                     "execution_count": None, "source": "x = 1"},
                    {"cell_type": "code", "id": "c", "metadata": {}, "outputs": [], "execution_count": None,
                     "source": "import time; t_first_cell = time.time()"}],
          "metadata": {"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}},
          "nbformat": 4, "nbformat_minor": 5}
    with tempfile.TemporaryDirectory() as d:
        p = Path(d) / "empty.ipynb"; p.write_text(json.dumps(nb))
        times = []
        for _ in range(3):
            t0 = time.perf_counter(); execute_point(make_point(p, {})); times.append(time.perf_counter() - t0)
        print(f"papermill run of a trivial notebook (kernel start to end): median {statistics.median(times):.2f} s")
        pts = [make_point(ROOT / "nbs" / "10_flow_matching.ipynb", {"seed": s}) for s in range(4)]
        res = {}
        for w in (1, 2):
            t0 = time.perf_counter()
            run_points([dict(q) for q in pts], Path(d) / f"w{w}", workers=w, progress=False)
            res[w] = time.perf_counter() - t0
        print(f"4 smoke runs of nbs/10_flow_matching.ipynb (seeds 0-3): 1 worker {res[1]:.1f} s, 2 workers {res[2]:.1f} s, speed-up {res[1] / res[2]:.2f}x")


LM_PROMPTS = ["Write a short sentence about the sea.", "What is the capital of France?",
              "Name three colours of the rainbow and say which one you like best.", "Explain rain to a child.",
              "Give me a tip for learning to cook pasta at home on a weekday evening.", "Say hello.",
              "What do bees make?", "Describe a quiet morning in a small mountain village in two sentences."]


def bench_lm(new_tokens=32, repeats=5):
    "SmolLM2-135M: load from the cache; greedy tokens/s at batch 1 and batch 8 (KV cache), with and without a capture hook."
    code = ("import time, transformers.models.llama.modeling_llama; from genlab.lm import load_smollm2; "
            "t=time.perf_counter(); h=load_smollm2(); print(time.perf_counter()-t)")
    subprocess.run([sys.executable, "-c", code], capture_output=True)  # make sure the cache exists
    load = float(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True).stdout.strip().split()[-1])
    from genlab.lm import load_smollm2
    h = load_smollm2()
    single = h.chat_prompt(LM_PROMPTS[0])
    batch = h.chat_prompt(LM_PROMPTS)                     # left-padded Batch of 8 prompts of different lengths

    def timed(prompt, hook, n):
        t0 = time.perf_counter()
        with h.capture([10, 20]) if hook else contextlib.nullcontext():
            h.generate(prompt, max_new_tokens=n, stop_at_eos=False)
        return time.perf_counter() - t0

    timed(single, False, 2); timed(batch, False, 2)       # warm-up
    cases = [(b, hook) for b in (1, 8) for hook in (False, True)]
    total = {c: [] for c in cases}
    prefill = {c: [] for c in cases}
    for _ in range(repeats):                              # interleaved, so that machine load hits every case alike
        for b, hook in cases:
            p = single if b == 1 else batch
            total[(b, hook)].append(timed(p, hook, new_tokens))
            prefill[(b, hook)].append(timed(p, hook, 1))
    rate = {c: c[0] * new_tokens / min(total[c]) for c in cases}
    decode = {c: c[0] * (new_tokens - 1) / (min(total[c]) - min(prefill[c])) for c in cases}
    print(f"SmolLM2-135M: load from cache {load:.2f} s (new process, after imports); threads={torch.get_num_threads()}, "
          f"greedy, {new_tokens} new tokens, KV cache, best of {repeats} (interleaved); batch 8 = 8 chat prompts of "
          f"{batch.attention_mask.sum(1).min().item()}-{batch.ids.shape[1]} tokens, left-padded")
    for b in (1, 8):
        plain, hooked = rate[(b, False)], rate[(b, True)]
        print(f"  batch {b}: {plain:6.1f} tok/s end to end ({decode[(b, False)]:6.1f} decoding only) without hooks, "
              f"{hooked:6.1f} ({decode[(b, True)]:6.1f}) with a capture hook on 2 layers ({100 * (hooked / plain - 1):+.1f}%)")
    print(f"  batch 8 / batch 1 throughput: {rate[(8, False)] / rate[(1, False)]:.2f}x end to end "
          f"({decode[(8, False)] / decode[(1, False)]:.2f}x decoding only) without hooks, "
          f"{rate[(8, True)] / rate[(1, True)]:.2f}x ({decode[(8, True)] / decode[(1, True)]:.2f}x) with hooks")


bench_smollm2 = bench_lm   # the old section name


def bench_shc(batch=8, tokens=256, C=64, n=4, repeats=40):
    import math
    import torch.nn.functional as F
    from genlab.shc import HyperConnection
    torch.set_num_threads(1)
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
    U64 = torch.zeros(n, m, dtype=torch.float64)   # the Helmert basis, built in float64
    for i in range(1, n):
        U64[:i, i - 1] = 1 / math.sqrt(i * (i + 1)); U64[i, i - 1] = -i / math.sqrt(i * (i + 1))
    I64 = torch.eye(m, dtype=torch.float64)
    U, I = U64.float(), I64.float()

    def coefficients(Xs, dyn):
        v = Xs.flatten(-2)
        xbar = F.normalize(v, dim=-1, eps=1e-6) * math.sqrt(v.shape[-1]) * (1 + hc.norm_gain)
        return dyn(xbar)

    def reference_fused(Xs):
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

    def two_step(Xs):
        r = coefficients(Xs, hc.dynamic)
        a = torch.sigmoid(hc.scale_pre * r[..., :n] + hc.static_pre)
        b = 2 * torch.sigmoid(hc.scale_post * r[..., n:2 * n] + hc.static_post)
        H = hc.res_matrix(r[..., 2 * n:])
        y = lin((a[..., None] * Xs).sum(-2))
        return torch.einsum("...st,...sc->...tc", H, Xs) + b[..., None] * y[..., None, :]

    impls = {"genlab HyperConnection": lambda Xs: hc(Xs, lin), "fused-einsum reference": reference_fused,
             "two-step (separate contractions)": two_step}
    outs = {}
    for name, f in impls.items():
        y = f(X)
        gx, = torch.autograd.grad(y.square().sum(), X)
        outs[name] = (y.detach(), gx)
    y0, g0 = outs["genlab HyperConnection"]
    print("float32 (the inverse differs: closed-form adjugate in genlab, LU solve in the reference):")
    for name, (y, gx) in outs.items():
        print(f"  {name:34s} max |out − genlab| {float((y - y0).abs().max()):.1e}, "
              f"max |grad − genlab| / max |grad| {float((gx - g0).abs().max() / g0.abs().max()):.1e}")
    # the same three in float64: identical up to rounding
    for mod in (hc, lin, *ref.values()):
        mod.double()
    X64 = X.detach().double().requires_grad_()
    U, I = U64, I64
    o64 = {}
    for name, f in impls.items():
        y = f(X64)
        gx, = torch.autograd.grad(y.square().sum(), X64)
        o64[name] = (y.detach(), gx)
    print("float64:")
    for name, (y, gx) in o64.items():
        print(f"  {name:34s} max |out − genlab| {float((y - o64['genlab HyperConnection'][0]).abs().max()):.1e}, "
              f"max |grad − genlab| {float((gx - o64['genlab HyperConnection'][1]).abs().max()):.1e}")
    for mod in (hc, lin, *ref.values()):
        mod.float()
    U, I = U64.float(), I64.float()
    times = {name: [] for name in impls}
    for _ in range(repeats):                    # interleaved rounds: load on a shared machine hits all alike
        for name, f in impls.items():
            t0 = time.perf_counter()
            f(X).square().sum().backward()
            times[name].append(time.perf_counter() - t0)
            X.grad = None; hc.zero_grad(set_to_none=True); lin.zero_grad(set_to_none=True)
            for mod in ref.values():
                mod.zero_grad(set_to_none=True)
    base = statistics.median(times["fused-einsum reference"])
    print(f"shc sublayer forward+backward, {batch}x{tokens} tokens, C = {C}, n = {n}, 1 thread, median of {repeats}:")
    for name, ts in times.items():
        med = statistics.median(ts)
        print(f"  {name:34s} {1000 * med:7.2f} ms  ({med / base:.2f}x the fused reference)")


if __name__ == "__main__":
    print(f"OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS')}, torch {torch.__version__}, {os.cpu_count()} cores")
    which = sys.argv[1:] or ["fit", "cfm", "papermill", "lm", "shc"]
    for w in which:
        {"fit": bench_fit, "cfm": bench_cfm, "papermill": bench_papermill, "lm": bench_lm, "smollm2": bench_lm,
         "shc": bench_shc}[w]()
