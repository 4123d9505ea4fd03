#!/usr/bin/env python3
"""Run every notebook's smoke preset on a device (default: `GENLAB_DEVICE=cuda`) and write a table.

Each notebook runs in a fresh Python process as a plain script: its code cells in order (the parameters
cell kept, optional overrides appended after it), outside a kernel, so `genlab.record` prints and
`genlab.plot.explore` makes its one static call. No Jupyter stack is needed, which lets this run on a
machine without network where papermill/ipykernel are absent.

Two modes, because no notebook chooses a device itself (`genlab.core.get_device()` is not called by them):

- `asis`: the notebook as written, with `GENLAB_DEVICE` set. The table says whether CUDA was used at all
  (peak CUDA memory of the process).
- `host`: as `default`, but `.numpy()` on a device tensor goes through `.cpu()` (and is counted), to see
  what breaks after the numpy round trips.
- `default`: the process computes on `get_device()`: `torch.set_default_device(get_device())` and
  `genlab.core.rng(...)` draws on that device unless told otherwise. This is what a device-following
  notebook would do; what breaks here (a generator or tensor made on the CPU, a numpy round trip, a dtype)
  is what breaks on a GPU.

Usage (on a GPU machine):  python tools/gpu_smoke.py --out OUT --jobs 8 --deadline 330
Writes OUT/table.md, OUT/results.json and OUT/logs.tar.gz (one log per run).
"""
from __future__ import annotations

import argparse
import concurrent.futures as cf
import json
import os
import re
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
NB_NAME = re.compile(r"^(\d\d[a-z]?)_(\w+)\.ipynb$")
CORE_CHEAP = ("00_core", "01_data", "02_train", "02a_parts", "03_metrics", "05a_stats")

REPORT = """
try:
    from IPython.display import display  # a builtin in a Jupyter kernel
except ImportError:
    display = print
_genlab_host_copies = [0]
def _genlab_smoke_report():
    used = torch.cuda.is_available() and torch.cuda.is_initialized()
    peak = torch.cuda.max_memory_allocated() if used else 0
    print("GENLAB_SMOKE_DEVICE " + json.dumps({"cuda_initialised": bool(used), "cuda_peak_bytes": int(peak),
          "numpy_round_trips": _genlab_host_copies[0]}), flush=True)
atexit.register(_genlab_smoke_report)
"""
HOST = """
_genlab_numpy = torch.Tensor.numpy
def _genlab_numpy_via_host(self, *args, **kwargs):  # count .numpy() on a device tensor, then do it through .cpu()
    if self.device.type != "cpu":
        _genlab_host_copies[0] += 1
        return _genlab_numpy(self.detach().cpu(), *args, **kwargs)
    return _genlab_numpy(self, *args, **kwargs)
torch.Tensor.numpy = _genlab_numpy_via_host
"""
PRELUDE = {
    "asis": """
import os, atexit, json, torch
""" + REPORT,
    "default": """
import os, atexit, json, torch
import genlab.core as _genlab_core
_genlab_dev = _genlab_core.get_device()
torch.set_default_device(_genlab_dev)
_genlab_rng = _genlab_core.rng
def _genlab_rng_on_device(seed, *names, device=None):
    return _genlab_rng(seed, *names, device=_genlab_dev if device is None else device)
_genlab_rng_on_device.__doc__ = _genlab_rng.__doc__
_genlab_core.rng = _genlab_rng_on_device
""" + REPORT,
}
PRELUDE["host"] = PRELUDE["default"] + HOST  # default, with .numpy() on a device tensor done through the host (counted)


def notebooks(only: list[str] | None, core: bool) -> list[Path]:
    "Method notebooks (10+) and, with `core`, the cheap core ones; `only` filters by slug or stem."
    out = []
    for p in sorted((ROOT / "nbs").glob("*.ipynb")):
        m = NB_NAME.match(p.name)
        if not m:
            continue
        method = m.group(1)[:2].isdigit() and int(m.group(1)[:2]) >= 10
        if not (method or (core and p.stem in CORE_CHEAP)):
            continue
        if only and m.group(2) not in only and p.stem not in only:
            continue
        out.append(p)
    return out


RUNNER = """
import __future__, linecache, sys
_genlab_flags = 0
for _genlab_i, _genlab_src in _genlab_cells:
    _genlab_name = f"<cell {_genlab_i}>"
    linecache.cache[_genlab_name] = (len(_genlab_src), None, _genlab_src.splitlines(True), _genlab_name)
    print(f"GENLAB_SMOKE_CELL {_genlab_i}", file=sys.stderr, flush=True)
    _genlab_code = compile(_genlab_src, _genlab_name, "exec", flags=_genlab_flags, dont_inherit=True)
    _genlab_flags |= _genlab_code.co_flags & __future__.annotations.compiler_flag  # as IPython keeps a cell's future imports
    exec(_genlab_code, globals())
"""


def script_of(nb: Path, mode: str, params: dict) -> str:
    "A script that runs the notebook's code cells one by one (each compiled on its own, as a kernel does) after a prelude."
    cells = json.loads(nb.read_text(encoding="utf-8"))["cells"]
    try:  # magics become get_ipython() calls, as in a kernel (they then fail here: no notebook uses them)
        from IPython.core.inputtransformer2 import TransformerManager
        transform = TransformerManager().transform_cell
    except ImportError:
        transform = lambda src: src  # noqa: E731
    code = []
    for i, c in enumerate(cells):
        if c["cell_type"] != "code":
            continue
        code.append((i, transform("".join(c["source"]) + "\n")))
        if "parameters" in c.get("metadata", {}).get("tags", []) and params:
            code.append((f"{i}-injected", "".join(f"{k} = {v!r}\n" for k, v in params.items())))
    return PRELUDE[mode] + f"\n_genlab_cells = {code!r}\n" + RUNNER


def last_error(text: str) -> str:
    "The last line of the last traceback in `text` (the exception and its message), else the last line."
    lines = [l.rstrip() for l in text.splitlines() if l.strip()]
    idx = [i for i, l in enumerate(lines) if l.startswith("Traceback (most recent call last)")]
    if idx:
        tail = lines[idx[-1]:]
        exc = [l for l in tail if re.match(r"^[A-Za-z_][\w\.]*(Error|Exception|Interrupt|Exit|Warning)?\b.*:|^[A-Za-z_][\w\.]*Error$", l)
               and not l.startswith(" ")]
        if exc:
            return exc[-1][:400]
    return (lines[-1] if lines else "")[:400]


def run_one(job: dict, logdir: Path, timeout: float, env_extra: dict) -> dict:
    nb, mode, params = Path(job["nb"]), job["mode"], job["params"]
    name = f"{nb.stem}__{mode}" + ("".join(f"__{k}-{v}" for k, v in params.items()) if params else "")
    name = re.sub(r"[^\w\.-]", "_", name)
    env = dict(os.environ, **env_extra)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT)] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="genlab-smoke-") as tmp:
        script = Path(tmp) / f"{nb.stem}.py"
        script.write_text(script_of(nb, mode, params), encoding="utf-8")
        try:
            p = subprocess.run([sys.executable, "-u", str(script)], cwd=tmp, env=env, capture_output=True,
                               text=True, timeout=timeout)
            rc, out, err = p.returncode, p.stdout, p.stderr
        except subprocess.TimeoutExpired as e:
            rc = "timeout"
            out = (e.stdout or b"").decode(errors="replace") if isinstance(e.stdout, bytes) else (e.stdout or "")
            err = (e.stderr or b"").decode(errors="replace") if isinstance(e.stderr, bytes) else (e.stderr or "")
    secs = round(time.perf_counter() - t0, 1)
    (logdir / f"{name}.log").write_text(f"# rc={rc} seconds={secs}\n# ---- stdout\n{out}\n# ---- stderr\n{err}",
                                        encoding="utf-8")
    dev = {}
    for line in out.splitlines():
        if line.startswith("GENLAB_SMOKE_DEVICE "):
            dev = json.loads(line.split(" ", 1)[1])
    cells = re.findall(r"^GENLAB_SMOKE_CELL (\S+)$", err, re.M)
    cell = cells[-1] if cells else None  # the cell running when the process ended
    if rc == 0:
        status, error = "ok", ""
    elif rc == "timeout":
        status, error = "failed", f"timeout after {timeout:.0f} s"
    else:
        error = last_error(err or out)
        missing = re.search(r"(ModuleNotFoundError|MissingPackageError)", error)
        status = "not run (missing package)" if missing else "failed"
    return {"notebook": nb.stem, "mode": mode, "params": params, "status": status, "seconds": secs,
            "error": error, "cell": None if rc == 0 else cell, "rc": rc, **dev, "log": f"{name}.log"}


UNIT_CHECKS = r"""
import json, sys, traceback, torch
from genlab import core, data, metrics, parts
dev = torch.device(sys.argv[1])
g = lambda name: core.rng(0, "device-check", name, device=dev)
x, y = torch.randn(64, 2, device=dev), torch.randn(64, 2, device=dev)
checks = {
    "core.rng(device=)": lambda: torch.randn(3, generator=g("rng"), device=dev),
    **{f"data.sample_toy({n!r}, generator on device)": (lambda n=n: data.sample_toy(n, 16, g(n))) for n in data.TOY_SAMPLERS},
    "data.sample_gmm(means on device, generator on device)": lambda: data.sample_gmm(16, torch.zeros(2, 2, device=dev), 1.0, generator=g("gmm")),
    "parts.time_embedding(t on device)": lambda: parts.time_embedding(torch.rand(5, device=dev), 8),
    "parts.linear_interpolant(on device)": lambda: parts.linear_interpolant(x, y, torch.rand(64, device=dev))[0],
    "parts.mlp(generator on device)(x)": lambda: parts.mlp([2, 8, 2], generator=g("mlp"))(x),
    "parts.TopKSAE(generator on device)(x)": lambda: parts.TopKSAE(2, 8, 2, generator=g("sae"))(x)[0],
    "metrics.mmd_rbf": lambda: metrics.mmd_rbf(x, y),
    "metrics.energy_distance": lambda: metrics.energy_distance(x, y),
    "metrics.sliced_w2(generator on device)": lambda: metrics.sliced_w2(x, y, 16, generator=g("sw2")),
    "metrics.sliced_w2(no generator)": lambda: metrics.sliced_w2(x, y, 16),
    "metrics.frechet_distance": lambda: metrics.frechet_distance(x, y),
    "metrics.explained_variance": lambda: metrics.explained_variance(x, y),
    "metrics.entropy_from_logits": lambda: metrics.entropy_from_logits(x),
}
out = []
for name, fn in checks.items():
    try:
        r = fn()
        where = str(r.device) if isinstance(r, torch.Tensor) else type(r).__name__
        ok = not isinstance(r, torch.Tensor) or r.device.type == dev.type
        out.append({"check": name, "ok": ok, "result": where, "error": ""})
    except Exception as e:  # noqa: BLE001
        out.append({"check": name, "ok": False, "result": "", "error": f"{type(e).__name__}: {e}".splitlines()[0][:300]})
print(json.dumps(out))
"""


def unit_checks(device: str, out: Path) -> list[dict]:
    "Function-level checks of the core building blocks on `device` (inputs and generators there)."
    p = subprocess.run([sys.executable, "-c", UNIT_CHECKS, device], capture_output=True, text=True, timeout=120,
                       env=dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])))
    try:
        rows = json.loads(p.stdout.strip().splitlines()[-1])
    except Exception:  # noqa: BLE001
        rows = [{"check": "unit checks", "ok": False, "result": "", "error": last_error(p.stderr or p.stdout)}]
    lines = ["| check | ok | result | error |", "|---|---|---|---|"]
    lines += [f"| {r['check']} | {r['ok']} | {r['result']} | {r['error'].replace('|', '/')} |" for r in rows]
    (out / "unit_checks.md").write_text("\n".join(lines) + "\n", encoding="utf-8")
    print("\n".join(lines), flush=True)
    return rows


def table(rows: list[dict], device: str) -> str:
    out = [f"GPU smoke: device {device}; modes: asis = notebook as written with GENLAB_DEVICE set, "
           "default = torch default device and genlab.core.rng on get_device(), host = default with .numpy() through .cpu()", "",
           "| notebook | mode | params | status | seconds | CUDA peak MiB | .numpy() on device | error (last line) |",
           "|---|---|---|---|---|---|---|---|"]
    for r in sorted(rows, key=lambda r: (r["notebook"], r["mode"] != "asis", json.dumps(r["params"]))):
        peak = r.get("cuda_peak_bytes")
        peak = "" if peak is None else f"{peak / 2**20:.0f}"
        prm = ", ".join(f"{k}={v}" for k, v in r["params"].items())
        err = (f"[cell {r['cell']}] " if r.get("cell") else "") + r["error"].replace("|", "\\|")
        out.append(f"| {r['notebook']} | {r['mode']} | {prm} | {r['status']} | {r['seconds']} | {peak} | "
                   f"{r.get('numpy_round_trips', '') if r['mode'] == 'host' else ''} | {err} |")
    return "\n".join(out) + "\n"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--device", default="cuda", help="GENLAB_DEVICE for the runs")
    ap.add_argument("--modes", default="asis,default")
    ap.add_argument("--only", default="", help="comma-separated slugs or stems")
    ap.add_argument("--core", action="store_true", help="also the cheap core notebooks")
    ap.add_argument("--extra", action="append", default=[],
                    help="an extra run: STEM_OR_SLUG:name=value[,name=value] (value a Python literal), both modes")
    ap.add_argument("--unit", action="store_true", help="first run the function-level device checks")
    ap.add_argument("--jobs", type=int, default=4)
    ap.add_argument("--threads", type=int, default=2, help="OMP_NUM_THREADS per run")
    ap.add_argument("--timeout", type=float, default=150, help="seconds per run")
    ap.add_argument("--deadline", type=float, default=0, help="seconds for everything; runs not started by then are skipped")
    a = ap.parse_args(argv)
    import ast
    a.out.mkdir(parents=True, exist_ok=True)
    logdir = Path(tempfile.mkdtemp(prefix="genlab-smoke-logs-"))  # outside OUT: only the archive comes back
    modes = [m for m in a.modes.split(",") if m]
    nbs = notebooks([s for s in a.only.split(",") if s] or None, a.core)
    jobs = [{"nb": str(nb), "mode": m, "params": {}} for m in modes for nb in nbs]  # mode by mode, in --modes order
    for e in a.extra:
        key, kv = e.split(":", 1)
        params = {k: ast.literal_eval(v) for k, v in (x.split("=", 1) for x in kv.split(","))}
        for nb in notebooks([key], True):
            jobs += [{"nb": str(nb), "mode": m, "params": params} for m in modes]
    env = {"GENLAB_DEVICE": a.device, "OMP_NUM_THREADS": str(a.threads), "MKL_NUM_THREADS": str(a.threads),
           "MPLBACKEND": "Agg", "TQDM_DISABLE": "1", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "PYTHONUNBUFFERED": "1"}
    t_start = time.perf_counter()
    if a.unit:
        unit_checks(a.device, a.out)
    rows = []

    def guarded(job):
        left = a.deadline - (time.perf_counter() - t_start) if a.deadline else a.timeout
        if left < 10:
            return {"notebook": Path(job["nb"]).stem, "mode": job["mode"], "params": job["params"],
                    "status": "not run (deadline)", "seconds": 0, "error": ""}
        return run_one(job, logdir, min(a.timeout, left), env)

    with cf.ThreadPoolExecutor(a.jobs) as ex:
        futs = [ex.submit(guarded, j) for j in jobs]
        for f in cf.as_completed(futs):
            r = f.result()
            rows.append(r)
            print(f"{r['notebook']:28s} {r['mode']:8s} {r['status']:10s} {r['seconds']:7.1f}s {r['error'][:160]}", flush=True)
            (a.out / "results.json").write_text(json.dumps(rows, indent=1), encoding="utf-8")
    dev = a.device
    try:
        import torch
        if dev.startswith("cuda") and torch.cuda.is_available():
            dev += f" ({torch.cuda.get_device_name(0)}, torch {torch.__version__})"
    except Exception:  # noqa: BLE001
        pass
    (a.out / "table.md").write_text(table(rows, dev), encoding="utf-8")
    with tarfile.open(a.out / "logs.tar.gz", "w:gz") as t:
        t.add(logdir, arcname="logs")
    print(table(rows, dev))
    print(f"total {time.perf_counter() - t_start:.0f} s; logs in {logdir} and {a.out / 'logs.tar.gz'}")


if __name__ == "__main__":
    main()
