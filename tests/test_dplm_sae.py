"""Unit tests for genlab.dplm_sae with independent oracles: exact enumeration of a tiny Potts model, brute-force
energies and controls, scikit-learn / scipy references, hand-written trajectories and alignments."""
import itertools

import numpy as np
import pytest
import torch
import torch.nn as nn

from genlab.core import ParameterError, resolve
from genlab.dplm_sae import (AA, MASK, PAD, PRESETS, PottsFamily, auroc_columns, commit_steps, denoise,
                             diffusion_loss, encode_sequence, fisher_enriched, gibbs_sample, load_hmm, load_proteome,
                             make_family, mask_tokens, match_state_map, matched_controls, mcsa_catalytic_states,
                             mcsa_entry, ols_beta, relative_entropy_states, search_domains, spearman_within, train_layer_saes)

torch.set_num_threads(1)


def test_masked_fraction_and_pads():
    g = torch.Generator().manual_seed(0)
    x = torch.randint(0, 20, (100, 110), generator=g)
    x[:, 100:] = PAD
    for t in (0.1, 0.5, 0.9):
        xt, m = mask_tokens(x, t, g)
        assert abs(m[:, :100].float().mean().item() - t) <= 0.02  # 10k positions
        assert not m[:, 100:].any() and (xt[m] == MASK).all() and (xt[~m] == x[~m]).all()


class _Fixed(nn.Module):
    "A 'model' returning fixed logits (b, L, 20) whatever the input."
    def __init__(self, logits):
        super().__init__()
        self.logits = logits

    def forward(self, x):
        return self.logits[: x.shape[0], : x.shape[1]]


def test_loss_is_masked_cross_entropy_over_length_with_1_over_t():
    g = torch.Generator().manual_seed(1)
    x = torch.randint(0, 20, (6, 12), generator=g)
    x[:, 10:] = PAD
    logits = torch.randn(6, 12, 20, generator=g)
    t = torch.tensor([0.2, 0.4, 0.5, 0.6, 0.8, 1.0])
    model = _Fixed(logits)
    s = 123
    lw = diffusion_loss(model, x, t, torch.Generator().manual_seed(s))
    lu = diffusion_loss(model, x, t, torch.Generator().manual_seed(s), weighted=False)
    _, m = mask_tokens(x, t, torch.Generator().manual_seed(s))  # the same mask
    logp = logits.log_softmax(-1)
    per = []
    for b in range(6):
        tot = sum(-logp[b, i, x[b, i]].item() for i in range(12) if m[b, i])
        per.append(tot / 10)  # 10 non-pad positions
    assert lu.item() == pytest.approx(np.mean(per), rel=1e-5)
    assert lw.item() == pytest.approx(np.mean(np.array(per) / t.numpy()), rel=1e-5)
    # changing the logits at unmasked or pad positions leaves the loss unchanged
    l2 = logits.clone()
    l2[~m] += 5 * torch.randn(int((~m).sum()), 20, generator=g)
    assert diffusion_loss(_Fixed(l2), x, t, torch.Generator().manual_seed(s)).item() == pytest.approx(lw.item(), rel=1e-6)


def test_layer_saes_are_reproducible_named_streams():
    states = [torch.randn(400, 12, generator=torch.Generator().manual_seed(i)) for i in range(2)]
    a, ha = train_layer_saes(states, 30, 4, 25, 64, 1e-3, 0, "sae", "trained")
    b, _ = train_layer_saes(states, 30, 4, 25, 64, 1e-3, 0, "sae", "trained")
    c, _ = train_layer_saes(states, 30, 4, 25, 64, 1e-3, 0, "sae", "untrained")
    assert len(a) == len(ha) == 2 and all(torch.equal(x.W_dec, y.W_dec) for x, y in zip(a, b))
    assert not torch.equal(a[0].W_dec, c[0].W_dec) and not torch.equal(a[0].W_dec, a[1].W_dec)
    for sae, h in zip(a, states):
        assert torch.allclose(sae.W_dec.norm(dim=1), torch.ones(30), atol=1e-5)
        assert ((sae.encode(h) != 0).sum(-1) == 4).all()
        assert torch.allclose(sae.b_pre, h.mean(0), atol=0.5)   # b_pre starts at the mean and moves little in 25 steps


def test_sae_k_larger_than_width_rejected_by_config():
    with pytest.raises(ParameterError, match="sae_k"):
        resolve(PRESETS, "smoke", sae_k=100, sae_latents=64)


def test_commit_steps_hand_trajectory():
    tr = np.array([[MASK, MASK, MASK, 4], [1, MASK, 7, 4], [1, 3, MASK, 4], [1, 3, 8, 4]])
    assert commit_steps(tr).tolist() == [1, 2, 3, 0]
    tr2 = np.array([[MASK, MASK], [5, MASK], [6, 2], [6, 2]])  # position 0 changes token at step 2: committed at 2
    assert commit_steps(tr2).tolist() == [2, 2]


def test_denoise_order_and_fractional_commit_times():
    L = 6
    # confidence of position i is fixed and increasing in i: the denoiser must unmask 5,4 then 3,2 then 1,0
    logits = torch.full((1, L, 20), -10.0)
    for i in range(L):
        logits[0, i, i] = float(i)
    x0 = torch.arange(L)[None]
    out = denoise(_Fixed(logits), x0, torch.ones(1, L, dtype=torch.bool), per_step=2)
    K = 3
    expect = {5: 0, 4: 0.5, 3: 1, 2: 1.5, 1: 2, 0: 2.5}
    for i, s in expect.items():
        assert out["commit"][0, i].item() == pytest.approx(s / K)
    assert out["correct"].all() and out["steps"] == 3
    # a fixed-score decoder follows the scores and needs no model
    out2 = denoise(None, x0, torch.ones(1, L, dtype=torch.bool), per_step=3, order="fixed",
                   scores=torch.tensor([[6.0, 5, 4, 3, 2, 1]]))
    assert (out2["commit"][0, :3] < 0.5).all() and (out2["commit"][0, 3:] >= 0.5).all()


def test_gibbs_matches_exact_enumeration_on_a_tiny_potts_model():
    rng = np.random.default_rng(0)
    L = 3
    h = rng.normal(0, 1, (L, 20))
    edges = np.array([[0, 1], [1, 2], [0, 2]])
    J = rng.normal(0, 0.7, (3, 20, 20))
    fam = PottsFamily(h, edges, J, np.zeros(0, int), np.zeros(0, int), np.zeros(0, int), np.zeros(0, int), np.zeros(0, int))
    allx = np.array(list(itertools.product(range(20), repeat=L)))
    E = fam.energy(allx)
    # brute-force energy of one sequence
    x = allx[1234]
    e_b = sum(h[i, x[i]] for i in range(L)) + sum(J[e, x[i], x[j]] for e, (i, j) in enumerate(edges))
    assert E[1234] == pytest.approx(e_b)
    p = np.exp(E - E.max()); p /= p.sum()
    exact = np.stack([np.bincount(allx[:, i], weights=p, minlength=20) for i in range(L)])
    xs = gibbs_sample(fam, 20000, 20, rng)
    emp = np.stack([np.bincount(xs[:, i], minlength=20) / len(xs) for i in range(L)])
    assert np.abs(emp - exact).max() < 0.015


def test_planted_conservation_and_family_structure():
    rng = np.random.default_rng(3)
    for idx, triad in ((0, "SHD"), (5, "CHN")):
        fam = make_family(idx, rng, L=64)
        x = gibbs_sample(fam, 1500, 60, rng)
        cons = [(x[:, s] == r).mean() for s, r in zip(fam.catalytic, fam.cat_res)]
        ctrl = [(x[:, s] == r).mean() for s, r in zip(fam.control, fam.ctrl_res)]
        assert all(abs(c - 0.97) <= 0.03 for c in cons + ctrl), (cons, ctrl)
        assert "".join(AA[r] for r in fam.cat_res) == triad
        assert sorted(AA[r] for r in fam.ctrl_res) == ["C", "G", "P"]
        assert all((x[:, m] == AA.index("G")).mean() > 0.85 for m in fam.motif)
        assert (fam.motif == fam.catalytic[0] + np.array([-2, 2])).all()
        deg = fam.degree()
        assert deg[fam.control].sum() == 0 and (deg[fam.catalytic] == 2).all()
        free = np.setdiff1d(np.arange(64), np.r_[fam.catalytic, fam.control, fam.motif])
        assert 2.5 < deg[free].mean() < 6.5  # about 3 random partners plus the chain


def test_encode_sequence_errors_name_character_and_position():
    assert encode_sequence("MKV").tolist() == [AA.index("M"), AA.index("K"), AA.index("V")]
    with pytest.raises(ParameterError, match=r"'Z' at position 3"):
        encode_sequence("ACDZ")
    with pytest.raises(ParameterError, match=r"'\*' at position 2"):
        encode_sequence("AC*")
    assert encode_sequence("AXA", unknown="pad").tolist() == [0, PAD, 0]


def test_auroc_and_spearman_against_references():
    from scipy.stats import spearmanr
    from sklearn.metrics import roc_auc_score
    rng = np.random.default_rng(0)
    pos, neg = rng.normal(0.5, 1, (30, 4)), rng.normal(0, 1, (50, 4))
    pos[:3] = 0; neg[:7] = 0
    y = np.r_[np.ones(30), np.zeros(50)]
    assert np.allclose(auroc_columns(pos, neg), [roc_auc_score(y, np.r_[pos[:, j], neg[:, j]]) for j in range(4)])
    x, t = rng.normal(size=(90, 2)), rng.normal(size=90)
    strata = np.repeat([0, 1, 2], 30)
    strata[:5] = 3  # a stratum below min_n is ignored
    ref = []
    for s in (0, 1, 2):
        sel = strata == s
        ref.append((sel.sum(), [spearmanr(x[sel, j], t[sel])[0] for j in range(2)]))
    w = np.array([n for n, _ in ref]); r = np.array([v for _, v in ref])
    assert np.allclose(spearman_within(x, t, strata), (w[:, None] * r).sum(0) / w.sum())


def test_matched_controls_brute_force():
    rng = np.random.default_rng(1)
    tok = rng.integers(0, 4, (12, 10))
    cand = rng.random((12, 10)) < 0.8
    pos = np.array([[0, 3], [5, 0], [7, 9]])
    got = {tuple(v) for v in matched_controls(tok, cand, pos).tolist()}
    want = {(s2, q) for s, p in pos for s2 in range(12) for q in range(10)
            if s2 != s and abs(q - p) <= 1 and cand[s2, q] and tok[s2, q] == tok[s, p]}
    assert got == want
    got2 = {tuple(v) for v in matched_controls(tok, cand, pos, same_aa=False).tolist()}
    assert got2 == {(s2, q) for s, p in pos for s2 in range(12) for q in range(10) if s2 != s and abs(q - p) <= 1 and cand[s2, q]}


def test_fisher_enriched_against_scipy_and_manual_bh():
    from scipy.stats import fisher_exact
    rng = np.random.default_rng(2)
    N, m = 2000, 5
    is_cat = np.zeros(N, bool); is_cat[:40] = True
    acts = rng.random((N, m))
    acts[:30, 0] += 2.0  # feature 0 fires on catalytic positions
    out = fisher_enriched(acts, is_cat, top=0.01)
    n_top = 20
    top0 = np.argsort(-acts[:, 0])[:n_top]
    a = int(is_cat[top0].sum())
    p0 = fisher_exact([[a, n_top - a], [40 - a, N - n_top - 40 + a]], alternative="greater").pvalue
    assert out["p"][0] == pytest.approx(p0) and 0 in out["C"]
    p = out["p"]; order = np.argsort(p); q = p[order] * m / np.arange(1, m + 1)
    q = np.minimum.accumulate(q[::-1])[::-1]
    bh = np.empty(m); bh[order] = np.minimum(q, 1)
    assert np.allclose(out["q"], bh)


def test_ols_beta_normal_equations():
    rng = np.random.default_rng(0)
    X = rng.normal(size=(200, 4)); y = X @ np.array([1.0, -2.0, 0.5, 0.0]) + 0.1 * rng.normal(size=200)
    assert np.allclose(ols_beta(X, y), np.linalg.solve(X.T @ X, X.T @ y))


def test_match_state_map_insert_and_deletion():
    # hmm row "AB.CD", target "ABxC-": A->1, B->2, x inserted (no state), C->3, state 4 (D) deleted
    assert match_state_map("AB.CD", "ABxC-", 1, 1) == [(0, 1), (1, 2), (3, 3)]
    assert match_state_map("ab.cD", "ABxC-", 10, 20) == [(19, 10), (20, 11), (22, 12)]


def test_real_data_hmmsearch_conservation_and_mcsa_map():
    prot = load_proteome()
    assert len(prot["seqs"]) == 2100 and all("*" not in s for s in prot["seqs"])
    pf, kr = load_hmm("PF02826"), load_hmm("KR")
    dpf, dkr = search_domains(pf, prot), search_domains(kr, prot)
    assert len(dpf) == 16 and len({d["protein"] for d in dpf}) == 15 and len(dkr) == 6
    # every mapped residue's state lies within the domain's HMM range and is strictly increasing
    for d in dpf:
        st = [s for _, s in d["map"]]
        assert all(b > a for a, b in zip(st, st[1:])) and 1 <= st[0] and st[-1] <= pf.M
    re = relative_entropy_states(pf)
    from pyhmmer.plan7 import Background
    bg = np.asarray(list(Background(pf.alphabet).residue_frequencies))[:20]
    e = np.asarray(pf.match_emissions)[50, :20]; e = e / e.sum()
    assert re[50] == pytest.approx(float(np.sum(e * np.log(e / bg))), rel=1e-5)
    m = mcsa_catalytic_states(pf, mcsa_entry("571"))
    assert m["states"] == (128, 157, 176) and m["error"] == 1 and m["unique"]
    with pytest.raises(ParameterError, match="PF99999"):
        load_hmm("PF99999")


def test_rotary_model_is_relative_with_an_end_marker():
    from genlab.dplm_sae import DiffusionPLM, _rope
    # RoPE preserves norms and makes q.k depend on the offset only
    q, k = torch.randn(1, 1, 1, 8), torch.randn(1, 1, 1, 8)
    rq = lambda x, p: _rope(torch.cat([torch.zeros(1, 1, p, 8), x], 2))[:, :, -1]
    assert torch.allclose(rq(q, 5).norm(), q.norm(), atol=1e-5)
    assert torch.allclose((rq(q, 7) * rq(k, 3)).sum(), (rq(q, 14) * rq(k, 10)).sum(), atol=1e-4)
    torch.manual_seed(0)
    m = DiffusionPLM(16, 2, 2, 32, max_len=40).eval()
    x = torch.randint(0, 20, (2, 20))
    with torch.no_grad():
        a = m(torch.cat([x, torch.full((2, 5), PAD)], 1))[:, :20]
        b = m(torch.cat([x, torch.full((2, 20), PAD)], 1))[:, :20]
        # the same 20 residues preceded by 3 residues: the end marker keeps the columns' distance to the end
        y = torch.cat([torch.randint(0, 20, (2, 3)), x], 1)
        c = m(y)[:, 3:]
    assert torch.allclose(a, b, atol=1e-5)          # trailing pads beyond the end marker change nothing
    assert not torch.allclose(a, c, atol=1e-3)      # but the prefix residues are seen (context, not a pure shift)
    with pytest.raises(ParameterError):
        DiffusionPLM(16, 1, 2, 32, positions="learned")
    with pytest.raises(ParameterError):
        m(torch.zeros(1, 41, dtype=torch.long))


def test_full_preset_meets_the_spec_budget():
    f = PRESETS["full"]
    assert f.train_steps >= 1000 and f.batch >= 48 and f.real_steps >= 1500 and f.real_batch >= 32
    assert f.sae_steps >= 1500 and f.sae_batch >= 1024 and f.sae_states >= 60000 and f.n_train >= 1200 and f.n_test >= 300
    assert f.n_denoise >= 200 and f.n_replicates >= 2 and f.n_null >= 200 and f.positions == "rotary"
