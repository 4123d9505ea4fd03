"Unit tests for genlab.sgpo: loss identities, reshaping invariants, advantages, trie decoding, semantic IDs, bad input."
import itertools
import math

import pandas as pd
import pytest
import torch

from genlab.core import ParameterError, resolve
from genlab.sgpo import (PRESETS, RQVAE, SIDPolicy, SIDTrie, assign_sids, beam_search, collapse_events,
                         diversity_collapses, group_advantages, hit_reward, match_eps, method_settings,
                         movielens_sequences, policy_loss, prefix_reward, reshape_advantages, sample_sids,
                         sid_logdists, sid_logprobs, token_kl, train_rl, train_rqvae)

torch.set_num_threads(1)


def _toy(K=4, n_items=20, seed=0):
    g = torch.Generator().manual_seed(seed)
    tuples = torch.tensor(list(itertools.product(range(K), repeat=3)))
    sids = tuples[torch.randperm(len(tuples), generator=g)[:n_items]]
    trie = SIDTrie(sids, K)
    torch.manual_seed(seed)
    pol = SIDPolicy(sids, K, d=16, ctx_len=4, n_heads=2)
    ctx = torch.randint(-1, n_items, (6, 4), generator=g)
    ctx[:, -1] = ctx[:, -1].clamp(min=0)
    return sids, trie, pol, ctx, g


def _rollouts(G=6, seed=0, perturb=0.05):
    sids, trie, old, ctx, g = _toy(seed=seed)
    new = SIDPolicy(sids, 4, d=16, ctx_len=4, n_heads=2)
    new.load_state_dict(old.state_dict())
    with torch.no_grad():
        for p in new.parameters():
            p.add_(perturb * torch.randn(p.shape, generator=g))
    c = ctx[:1].expand(G, -1)
    y, lp_old, ent = sample_sids(old, trie, old.encode(c), g)
    r = torch.rand(1, G, generator=g)
    adv = group_advantages(r).view(-1)
    return new, trie, c, y, lp_old, ent, adv


def _loss_and_grads(pol, trie, c, y, lp_old, adv, settings, ent=None):
    lp = sid_logprobs(pol, trie, pol.encode(c), y)
    out = policy_loss(lp, lp_old, adv, settings, ent)
    grads = torch.autograd.grad(out["loss"], list(pol.parameters()), allow_unused=True)
    return out["loss"], [torch.zeros_like(p) if g is None else g for g, p in zip(grads, pol.parameters())]


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_u1_sgpo_with_zero_powers_equals_gspo_in_loss_and_parameter_gradients(seed):
    new, trie, c, y, lp_old, _, adv = _rollouts(seed=seed)
    la, ga = _loss_and_grads(new, trie, c, y, lp_old, adv, method_settings("sgpo", gamma_pos=0.0, gamma_neg=0.0))
    lb, gb = _loss_and_grads(new, trie, c, y, lp_old, adv, method_settings("gspo"))
    assert abs(float(la.detach()) - float(lb.detach())) < 1e-6
    assert any(float(g.abs().max()) > 1e-4 for g in ga)  # the comparison is not vacuous
    for a, b in zip(ga, gb):
        assert torch.allclose(a, b, atol=1e-6)
    # with non-zero powers the gradients differ
    _, gc = _loss_and_grads(new, trie, c, y, lp_old, adv, method_settings("sgpo", gamma_pos=2.0, gamma_neg=2.0))
    assert max(float((a - b).abs().max()) for a, b in zip(gc, gb)) > 1e-6


def test_u2_gspo_token_with_uniform_token_advantages_equals_sequence_gspo():
    new, trie, c, y, lp_old, _, adv = _rollouts(seed=3)
    s_tok = dict(method_settings("gspo"), ratio="sequence_token")
    la, ga = _loss_and_grads(new, trie, c, y, lp_old, adv, s_tok)
    lb, gb = _loss_and_grads(new, trie, c, y, lp_old, adv, method_settings("gspo"))
    assert abs(float(la.detach()) - float(lb.detach())) < 1e-6
    for a, b in zip(ga, gb):
        assert torch.allclose(a, b, atol=1e-6)


def test_u3_reshaping_invariants_random():
    g = torch.Generator().manual_seed(0)
    for trial in range(50):
        n, L = 40, 3 + trial % 3
        lp = torch.log(torch.rand(n, L, generator=g) * 0.99 + 0.005)
        adv = torch.randn(n, generator=g) * 2
        adv[:5] = 0
        gp, gn = [0.5, 1.0, 2.0][trial % 3], [0.0, 1.0, 3.0][trial % 3]
        sig = [0.1, 0.5, 1.0][trial % 3]
        at, wt, _ = reshape_advantages(adv, lp, gp, gn, sig)
        assert torch.allclose(wt.mean(1), torch.ones(n), atol=1e-6)
        assert (wt.std(1, unbiased=False) <= sig + 1e-6).all()
        assert (wt > 0).all()
        nz = adv != 0
        assert (torch.sign(at[nz]) == torch.sign(adv[nz])[:, None]).all()
        assert (at[~nz] == 0).all() and torch.isfinite(at).all()
        assert torch.allclose(at.sum(1), L * adv, atol=1e-5)  # sequence credit preserved
        pos = adv > 0
        order = lp[pos].argsort(1)
        assert (wt[pos].gather(1, order).diff(dim=1) >= -1e-6).all()  # non-decreasing in ℓ for γ>0
    # variance bound: E_t[Â_it²] / Â_i² = 1 + var_t(w̃) ≤ 1 + σ_max²
    at, wt, w = reshape_advantages(adv, lp, 3.0, 3.0, 0.5)
    ratio = (at[adv != 0] ** 2).mean(1) / adv[adv != 0] ** 2
    assert (ratio <= 1.25 + 1e-5).all()
    # an all-zero group gives zeros and no NaN
    at0, _, _ = reshape_advantages(torch.zeros(4), torch.log(torch.rand(4, 3, generator=g)), 1.0, 1.0, 0.5)
    assert (at0 == 0).all()


def test_u4_clip_coherence_whole_sequence_clipped_or_not():
    new, trie, c, y, lp_old, _, adv = _rollouts(G=32, seed=4, perturb=0.3)
    for method in ("sgpo", "gspo"):
        s = method_settings(method, eps_low=0.01, eps_high=0.01)
        lp = sid_logprobs(new, trie, new.encode(c), y).detach().requires_grad_(True)
        out = policy_loss(lp, lp_old, adv, s)
        gl, = torch.autograd.grad(out["loss"], lp)
        zero = gl.abs() < 1e-12
        assert (zero.all(1) | (~zero).all(1)).all()  # per sequence all tokens clipped or none
        assert 0 < out["clip_frac"] < 1  # both cases occur: the test is not vacuous


def test_u5_on_policy_gradient_closed_form():
    g = torch.Generator().manual_seed(5)
    n, L = 12, 3
    lp_old = torch.log(torch.rand(n, L, generator=g) * 0.9 + 0.05)
    lp = lp_old.clone().requires_grad_(True)
    adv = group_advantages(torch.rand(2, 6, generator=g)).view(-1)
    out = policy_loss(lp, lp_old, adv, method_settings("sgpo"))
    gl, = torch.autograd.grad(out["loss"], lp)
    _, wt, _ = reshape_advantages(adv, lp_old, 1.0, 1.0, 0.5)
    assert torch.allclose(gl, -(adv[:, None] * wt) / (n * L), atol=1e-7)
    assert out["clip_frac"] == 0.0


def test_group_advantages_closed_forms_and_errors():
    r = torch.tensor([[1.0, 0.0], [0.3, 0.3], [2.0, 5.0]])
    a = group_advantages(r)
    d = 1e-6
    assert torch.allclose(a[0], torch.tensor([0.5, -0.5]) / (0.5 + d))
    assert (a[1] == 0).all()
    assert torch.allclose(a[2], torch.tensor([-1.5, 1.5]) / (1.5 + d))
    r4 = torch.tensor([[1.0, 2.0, 3.0, 6.0]])
    std = math.sqrt(((torch.tensor([1., 2., 3., 6.]) - 3) ** 2).mean().item())
    assert torch.allclose(group_advantages(r4), (r4 - 3) / (std + d))
    assert torch.allclose(group_advantages(r4, "mean"), r4 - 3)
    for bad in (torch.zeros(0, 4), torch.zeros(3, 0), torch.zeros(3, 1), torch.zeros(5)):
        with pytest.raises(ParameterError):
            group_advantages(bad)


def test_constrained_decoding_brute_force_over_trie():
    sids, trie, pol, ctx, g = _toy(K=3, n_items=10, seed=7)
    valid = {tuple(s) for s in sids.tolist()}
    allt = torch.tensor(list(itertools.product(range(3), repeat=3)))
    with torch.no_grad():
        h = pol.encode(ctx[:1])
        lp = sid_logprobs(pol, trie, h.expand(len(allt), -1), allt).sum(1)
        ok = torch.tensor([tuple(t) in valid for t in allt.tolist()])
        assert torch.isneginf(lp[~ok]).all() and torch.isfinite(lp[ok]).all()
        assert abs(float(lp[ok].exp().sum()) - 1) < 1e-5  # the constrained law sums to 1 over valid IDs
        y, lps, _ = sample_sids(pol, trie, h.expand(1000, -1), g)
        assert all(tuple(t) in valid for t in y.tolist())
        top, score = beam_search(pol, trie, h, beam=len(valid), topk=len(valid))
        brute = trie.items(allt[ok])[torch.sort(lp[ok], descending=True, stable=True).indices]
        assert top[0].tolist() == brute.tolist()
        top5, _ = beam_search(pol, trie, pol.encode(ctx), beam=5, topk=5)
        assert (top5 >= 0).all() and all(len(set(r)) == 5 for r in top5.tolist())


def test_semantic_ids_unique_deterministic_and_round_trip():
    g = torch.Generator().manual_seed(0)
    f = torch.randn(8, 6, generator=g)
    model = RQVAE(6, K=2, L=3, d_z=4, generator=torch.Generator().manual_seed(0))
    s1, s2 = assign_sids(model, f), assign_sids(model, f)
    assert torch.equal(s1, s2) and len({tuple(t) for t in s1.tolist()}) == 8  # 8 items fill all 2^3 IDs
    trie = SIDTrie(s1, 2)
    assert torch.equal(trie.items(s1), torch.arange(8))
    with pytest.raises(ParameterError):
        assign_sids(model, torch.randn(9, 6, generator=g))
    with pytest.raises(ParameterError):
        SIDTrie(torch.zeros(2, 3, dtype=torch.long), 2)


def test_rqvae_reconstruction_below_quarter_variance():
    g = torch.Generator().manual_seed(1)
    centres = torch.randn(8, 12, generator=g) * 2
    f = centres.repeat_interleave(8, 0) + 0.3 * torch.randn(64, 12, generator=g)
    model, _ = train_rqvae(f, K=8, L=3, steps=300, batch=64, generator=g, progress=False)
    sids = assign_sids(model, f)
    with torch.no_grad():
        mse = float(((model.decode_codes(sids) - f) ** 2).mean())
    assert mse < 0.25 * float(f.var(0).mean())


def test_prefix_reward_and_collapse_events():
    sids = torch.tensor([[0, 0, 0], [0, 0, 1], [0, 1, 0], [1, 0, 0]])
    t = torch.zeros(4, dtype=torch.long)
    r = prefix_reward(sids, torch.arange(4), t)
    disc = 1 / torch.log2(torch.tensor([2.0, 3.0, 4.0]))
    assert torch.allclose(r, torch.stack([disc.sum(), disc[:2].sum(), disc[:1].sum(), torch.tensor(0.)]) / disc.sum())
    assert collapse_events([1.0] * 50) == 0
    assert collapse_events([1.0] * 50 + [0.2] * 40) == 1
    assert collapse_events([1.0] * 50 + [0.2] * 10 + [1.0] * 30) == 0


def test_bad_input_is_rejected_before_training():
    for kw in ({"G": 0}, {"G": 1}, {"B": 0}, {"sigma_max": 0.0}, {"reward_mode": "ctr"}, {"n_per": 100},
               {"n_mini": 17}, {"eps_mode": "loose"}, {"ml_reward": "ndcg"}, {"kl_beta": -1.0}):
        with pytest.raises(ParameterError):
            resolve(PRESETS, "smoke", **kw)
    with pytest.raises(ParameterError, match="G"):
        resolve(PRESETS, "smoke", G=0)
    sids, trie, pol, ctx, g = _toy()
    fn = lambda ci, items, gen: torch.zeros(len(items))
    with pytest.raises(ParameterError, match="context"):
        train_rl(pol, trie, "sgpo", ctx[:0], fn, steps=1, B=2, G=2, n_mini=1, generator=g, progress=False)
    with pytest.raises(ParameterError, match="G"):
        train_rl(pol, trie, "sgpo", ctx, fn, steps=1, B=2, G=0, n_mini=1, generator=g, progress=False)
    with pytest.raises(ParameterError):
        method_settings("ppo")
    with pytest.raises(ParameterError, match="empty"):
        movielens_sequences({"ratings": pd.DataFrame(columns=["user_id", "item_id", "rating", "timestamp"]),
                             "items": pd.DataFrame(columns=["item_id", "class"])})
    with pytest.raises(ValueError, match="no features"):
        movielens_sequences({"ratings": pd.DataFrame({"user_id": [1] * 4, "item_id": [1, 2, 3, 4], "rating": [5] * 4,
                                                      "timestamp": [1, 2, 3, 4]}),
                             "items": pd.DataFrame({"item_id": [1, 2, 3], "class": ["Drama"] * 3})})


def test_movielens_missing_file_names_the_file(tmp_path):
    from genlab.data import load_movielens100k
    with pytest.raises(FileNotFoundError, match="ml-100k.inter"):
        load_movielens100k(tmp_path)


def test_u7_exact_token_kl_matches_monte_carlo_and_vanishes_on_policy():
    new, trie, c, y, lp_old, _, adv = _rollouts(G=8, seed=11, perturb=0.3)
    _, _, old, _, _ = _toy(seed=11)
    with torch.no_grad():
        lq = sid_logdists(old, trie, old.encode(c), y)
        lp = sid_logdists(new, trie, new.encode(c), y)
        kl = token_kl(lp, lq)  # (b,) Σ_t KL(p_t ‖ q_t)
        assert torch.allclose(token_kl(lp, lp), torch.zeros(len(y)), atol=1e-7)
        assert (kl > 1e-4).all()  # the perturbed policy moved: not a vacuous comparison
        g = torch.Generator().manual_seed(0)
        p = lp.exp().nan_to_num(0.0)  # (b, L, K), rows sum to 1 over valid children
        n = 200_000
        draws = torch.multinomial(p.reshape(-1, p.shape[-1]), n, replacement=True, generator=g)  # (b*L, n)
        lpf, lqf = lp.reshape(-1, p.shape[-1]), lq.reshape(-1, p.shape[-1])
        mc = (lpf.gather(1, draws) - lqf.gather(1, draws)).mean(1).view(len(y), -1).sum(1)
        assert torch.allclose(mc, kl, rtol=0.02)


def test_u8_collapse_detectors_fire_once_on_planted_drops_and_never_on_noise():
    g = torch.Generator().manual_seed(3)
    flat = (0.8 + 0.02 * torch.randn(200, generator=g)).tolist()
    assert collapse_events(flat) == 0
    # a 40% drop held for 35 steps: the EMA(0.9) needs ~10 steps to cross 70% of its max, then stays below ≥ 20 steps
    planted = flat[:100] + [0.8 * 0.6 + 0.01 * float(x) for x in torch.randn(35, generator=g)] + flat[135:]
    assert collapse_events(planted) == 1
    ent = (1.0 + 0.02 * torch.randn(12, generator=g)).tolist()
    hr = (0.25 + 0.005 * torch.randn(12, generator=g)).tolist()
    assert diversity_collapses(ent, hr, 1.0, 0.25) == 0
    ent_drop = ent[:6] + [0.45, 0.44, 0.46] + ent[9:]
    assert diversity_collapses(ent_drop, hr, 1.0, 0.25) == 1
    hr_drop = hr[:4] + [0.18, 0.17] + hr[6:]
    assert diversity_collapses(ent, hr_drop, 1.0, 0.25) == 1


def test_u9_shuffle_control_keeps_mean_spread_and_signs_of_the_weights():
    g = torch.Generator().manual_seed(9)
    n, L = 64, 3
    lp = torch.log(torch.rand(n, L, generator=g) * 0.95 + 0.02)
    adv = torch.randn(n, generator=g)
    adv[:4] = 0
    perm = torch.rand(n, L, generator=g).argsort(1)
    at, wt, w = reshape_advantages(adv, lp, 1.0, 1.0, 0.5)
    at_s, wt_s, w_s = reshape_advantages(adv, lp, 1.0, 1.0, 0.5, weight_fn="shuffle", perm=perm)
    assert torch.allclose(wt_s.mean(1), torch.ones(n), atol=1e-6)
    assert torch.allclose(wt_s.std(1, unbiased=False), wt.std(1, unbiased=False), atol=1e-7)
    assert torch.equal(wt_s.sort(1).values, wt.sort(1).values)  # same multiset of weights, only the order changes
    assert torch.equal(torch.sign(at_s), torch.sign(at))
    assert not torch.equal(wt_s, wt)  # the permutation did move weights
    with pytest.raises(ParameterError, match="perm"):
        reshape_advantages(adv, lp, weight_fn="shuffle")


def test_match_eps_picks_the_log_closest_grid_point_and_bisects():
    kl = lambda e: 1e-3 * e  # KL_upd linear in ε
    out = match_eps(kl, 1e-5)  # ε = 1e-2 is exact
    assert out["eps"] == 1e-2 and out["within_tol"]
    out = match_eps(kl, 1.7e-5)  # between 1e-2 and 3e-2, outside ±30% of both: one bisection step at √(3e-4)
    assert math.isclose(out["eps"], math.sqrt(1e-2 * 3e-2)) and out["within_tol"]
    with pytest.raises(ParameterError):
        match_eps(kl, 0.0)


def test_hit_reward_and_control_methods_settings():
    assert torch.equal(hit_reward(torch.tensor([1, 2, 3]), torch.tensor([1, 0, 3])), torch.tensor([1.0, 0.0, 1.0]))
    assert method_settings("sgpo_shufrew")["shuffle_rewards"] and method_settings("sgpo_min")["negate"]
    assert method_settings("sgpo_shuffle")["weight_fn"] == "shuffle"
    assert math.isinf(method_settings("sgpo_noscale")["sigma_max"]) and method_settings("gtpo")["weight_fn"] == "entropy"
    m = method_settings("dapo", eps_token=(0.1, 0.1))
    assert m["eps_low"] == 0.1 and math.isclose(m["eps_high"], 0.14)


def test_train_rl_logs_step_kl_and_reference_kl_and_rejects_bad_minibatching():
    sids, trie, pol, ctx, g = _toy(seed=2)
    fn = lambda ci, items, gen: (items % 2).float()
    res = train_rl(pol, trie, "sgpo", ctx, fn, steps=3, B=4, G=4, n_mini=2, lr=1e-2, generator=g, progress=False,
                   kl_beta=0.1, ref_policy=pol)
    lg = res["logs"]
    assert len(lg["kl_upd"]) == 3 and (lg["kl_upd"] > 0).all()  # one probe per rollout step, the policy moved
    assert len(lg["kl_ref"]) == 3 and 0 <= lg["kl_ref"][0] < lg["kl_ref"][-1]  # starts at the reference, then leaves it
    res0 = train_rl(pol, trie, "sgpo", ctx, fn, steps=1, B=4, G=4, n_mini=1, lr=1e-2, generator=g, progress=False,
                    kl_beta=0.1, ref_policy=pol)
    assert res0["logs"]["kl_ref"][0] < 1e-7  # the first update is taken at the reference policy itself
    assert res["updates"] == 6
    with pytest.raises(ParameterError, match="n_mini"):
        train_rl(pol, trie, "sgpo", ctx, fn, steps=1, B=2, G=2, n_mini=3, generator=g, progress=False)
    with pytest.raises(ParameterError, match="ref_policy"):
        train_rl(pol, trie, "sgpo", ctx, fn, steps=1, B=2, G=2, n_mini=1, kl_beta=0.1, generator=g, progress=False)
