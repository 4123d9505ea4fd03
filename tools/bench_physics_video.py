"""Speed of physics_video's parts, method and baselines side by side in one run (1 thread; untrained weights, which
cost the same as trained ones): PGDS / B5 / per-particle-MLP rollouts against the ground-truth and ballistic
simulators (scene-steps per second over the full preset's test scenes), and the video generator's sampling time per
clip (full-preset U-Net, W x W x K frames, 16 Euler steps). Usage: python tools/bench_physics_video.py"""
import os
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")
import torch

from genlab import physics_video as pv

torch.set_num_threads(1)
cfg = pv.PRESETS["full"]
clips = pv.make_clips(cfg.n_test, cfg.data_seed + 10_000, cfg.templates, cfg.n_frames)
scenes = [s for s, _ in clips]
steps = (cfg.n_frames - 1) * len(scenes)


def rate(fn):
    t0 = time.perf_counter(); fn(); return steps / (time.perf_counter() - t0)


rows = {}
for name, edges in (("PGDS (method)", "all"), ("B5: no inter-object edges", "intra"), ("per-particle MLP", "none")):
    torch.manual_seed(0)
    m = pv.PGDS(cfg.pgds_hidden, cfg.mp_steps, edges=edges, floor_radius=cfg.floor_radius)
    m.set_stats(*pv.pgds_stats(clips))
    rows[name] = rate(lambda: pv.rollout(m.eval(), scenes, cfg.n_frames, cfg.rigid_proj))
rows["GT simulator (PBD, numpy)"] = rate(lambda: [pv.simulate(s, cfg.n_frames) for s in scenes])
rows["ballistic simulator"] = rate(lambda: [pv.ballistic(s, cfg.n_frames) for s in scenes])
print(f"rollouts over {len(scenes)} test scenes x {cfg.n_frames - 1} frames (threads {torch.get_num_threads()}):")
for k, v in rows.items():
    print(f"  {k:32s} {v:8.1f} scene-steps/s")
frames = pv.target_frames(cfg.K, cfg.stride, cfg.n_frames)
data = pv.clip_tensors(clips[:16], cfg.W, frames)
gen = pv.VideoUNet(ch=cfg.gen_ch).eval()
noise = torch.randn(data["target"].shape, generator=torch.Generator().manual_seed(0))
for name, field in (("VIMF condition", data["vimf"]), ("no motion condition", None)):
    cond = pv.build_condition(data["frame0"], field) if field is not None else \
        pv.build_condition(data["frame0"], None).expand(-1, cfg.K, -1, -1, -1)
    t0 = time.perf_counter()
    pv.sample_video(gen, cond, noise, cfg.sampler_steps)
    print(f"generator sampling, {name:20s} {(time.perf_counter() - t0) / len(noise):.3f} s/clip "
          f"({cfg.K} frames of {cfg.W}x{cfg.W}, {cfg.sampler_steps} Euler steps, batch 16)")
