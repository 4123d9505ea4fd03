"""Unit tests for genlab.value_filter: closed forms, brute force, Monte Carlo and chi-square oracles."""
import itertools
import math
import os

import numpy as np
import pytest
import torch
from scipy import stats

from genlab.core import ParameterError, resolve, rng
from genlab.lm import tinygpt_handle
from genlab.value_filter import (GRAMMAR, PRESETS, LexiconJudge, QHead, bound_fi, check_decode_inputs, coupled_decode,
                                 coupling_stats, exact_values, expected_calibration_error, filter_step, grading_report,
                                 grammar_tokenizer, gumbel, judge_b, lexicon_safe, lexicon_token_ids, lexicon_values,
                                 make_judge, make_qhead, markov_world, pareto_levels_won, qhead_bce,
                                 rollout_features, sample_grammar, shuffled_values, simulate_markov, smol_prompts,
                                 token_edit_distance, touched_rows, unembedding)

torch.set_num_threads(1)
H = 6
G = lambda *names: rng(0, "test", *names)   # fresh generators of the same name give the same noise (the coupling)


@pytest.fixture(scope="module")
def world():
    w = markov_world()
    return w, exact_values(w["P"], w["unsafe"], w["eos"], H)


def brute_force_value(w, start, steps):
    "P(no unsafe token in the next `steps` tokens | last token `start`): enumerate every path of the chain."
    P, uns = w["P"].numpy(), w["unsafe"].numpy()
    total = 0.0
    for path in itertools.product(range(P.shape[0]), repeat=steps):
        p, last, safe = 1.0, start, True
        for v in path:
            p *= P[last, v]
            if p == 0:
                break
            safe, last = safe and not uns[v], v
        if p > 0 and safe:
            total += p
    return total


def test_value_targets_by_brute_force():
    w = markov_world()
    W3 = exact_values(w["P"], w["unsafe"], w["eos"], 3)
    for start in (2, 10, w["risky"][0], w["danger"][0]):
        for t in (0, 1, 2):
            assert abs(brute_force_value(w, start, 3 - t) - W3[t, start].item()) < 1e-12


def test_martingale_identity_and_monte_carlo(world):
    w, W = world
    live = ~w["unsafe"] & (torch.arange(w["V"]) > 1)
    m = (w["P"] @ W[1:].T).T                  # (H, V)
    assert (m[:, live] - W[:-1, live]).abs().max() < 1e-12
    g = torch.Generator().manual_seed(0)
    start = torch.full((40_000,), w["danger"][0])
    r = simulate_markov(w, W, n=40_000, horizon=H, generator=g, tau=0.0, start=start)
    p = r["base_safe"].double().mean().item()
    se = math.sqrt(p * (1 - p) / 40_000)
    assert abs(p - W[0, w["danger"][0]].item()) < 3 * se + 1e-9


def test_restricted_sampler_matches_pi_given_A():
    pi = torch.tensor([0.1, 0.3, 0.2, 0.25, 0.15])
    vals = torch.tensor([0.9, 0.1, 0.6, 0.8, 0.2])
    n = 100_000
    g = gumbel((n, 5), torch.Generator().manual_seed(1))
    tok, iv, fo = filter_step(pi.log().expand(n, 5), vals.expand(n, 5), g, 0.5)
    counts = torch.bincount(tok, minlength=5).numpy()
    assert counts[1] == 0 and counts[4] == 0 and not fo.any()
    A = [0, 2, 3]
    exp = (pi[A] / pi[A].sum()).double().numpy()
    exp = exp / exp.sum() * counts[A].sum()
    assert stats.chisquare(counts[A], exp).pvalue > 0.01
    # the intervention probability equals pi(A^c)
    assert abs(iv.double().mean().item() - 0.45) < 4 * math.sqrt(0.45 * 0.55 / n)


def test_gumbel_coupling_deterministic_and_tau0_is_base(world):
    w, W = world
    r1 = simulate_markov(w, W, n=2000, horizon=H, generator=torch.Generator().manual_seed(3), tau=0.3)
    r2 = simulate_markov(w, W, n=2000, horizon=H, generator=torch.Generator().manual_seed(3), tau=0.3)
    assert torch.equal(r1["out"], r2["out"])
    r0 = simulate_markov(w, W, n=2000, horizon=H, generator=torch.Generator().manual_seed(3), tau=0.0)
    assert torch.equal(r0["out"], r0["base"]) and not r0["intervened"].any()
    assert (r1["intervened"] | ~r1["differs"]).all()


def test_allowed_set_never_empty_with_exact_value(world):
    w, W = world
    g = torch.Generator().manual_seed(4)
    logP = torch.log(w["P"])
    for _ in range(10):
        t = int(torch.randint(0, H, (1,), generator=g))
        s = torch.randint(2, w["V"], (1000,), generator=g)
        s = s[~w["unsafe"][s]]
        tau = torch.rand(len(s), generator=g) * W[t, s]          # tau <= V(prefix)
        allowed = (W[t + 1][None] >= tau[:, None]) & torch.isfinite(logP[s])
        assert allowed.any(1).all()


def test_bound_and_negative_controls(world):
    w = markov_world()
    Wf = exact_values(w["P"], w["unsafe"], w["eos"], 12)
    keys = ("base_safe", "out_safe", "intervened", "differs")
    n = 60_000
    sq_excess, cd_ratio = [], []
    for tau in (0.1, 0.2, 0.3, 0.5, 0.7):
        r = simulate_markov(w, Wf, n=n, horizon=12, generator=torch.Generator().manual_seed(5), tau=tau)
        st = coupling_stats(**{k: r[k] for k in keys}, tau=tau)
        assert st["slack"] <= 3 * st["se_slack"]                                  # B1
        assert st["fi"] <= st["bound_b2"] + 3 * st["se_fi"]                       # B2
        if tau <= 0.3:
            q = simulate_markov(w, Wf ** 2, n=n, horizon=12, generator=torch.Generator().manual_seed(5), tau=tau)
            sq_excess.append(coupling_stats(**{k: q[k] for k in keys}, tau=tau)["slack"])
            c = simulate_markov(w, Wf, n=n, horizon=12, generator=torch.Generator().manual_seed(5), mode="cd", strength=3.0)
            sc = coupling_stats(**{k: c[k] for k in keys}, tau=tau)
            cd_ratio.append(sc["fi"] - tau * sc["int"])
    assert max(sq_excess) > 0 and max(cd_ratio) > 0                 # both controls violate FI <= tau*INT


def test_bound_function():
    assert bound_fi(0.0, p_unsafe=0.3) == 0.0 and bound_fi(0.0, p_int=0.7) == 0.0
    vals = [bound_fi(t, p_unsafe=0.2) for t in np.linspace(0, 0.9, 10)]
    assert all(b >= a for a, b in zip(vals, vals[1:]))
    with pytest.raises(ParameterError):
        bound_fi(1.5, p_int=0.1)


def test_qhead_shape_and_masked_gradient():
    head = QHead(8, 11, rank=3)
    torch.nn.init.normal_(head.F, std=0.1)
    h = torch.randn(2, 5, 8)
    assert head(h).shape == (2, 5, 11)
    taken = torch.tensor([1, 4, 4, 7])
    loss = qhead_bce(head, torch.randn(4, 8), taken, torch.tensor([1, 0, 1, 1]))
    loss.backward()
    nz = torch.nonzero(head.delta.grad).flatten().tolist()
    assert set(nz) <= {1, 4, 7} and set(nz) == {1, 4, 7}
    assert (head.F.grad.abs().sum(1) > 0).nonzero().flatten().tolist() == [1, 4, 7]


def test_edit_distance_and_judge():
    assert token_edit_distance([1, 2, 3], [1, 2, 3]) == 0
    assert token_edit_distance([1, 2, 3], [1, 3]) == pytest.approx(1 / 3)
    tok = grammar_tokenizer()
    x = sample_grammar(200, tok, torch.Generator().manual_seed(0))
    bad = [tok.stoi[w] for w in ("kill", "bomb", "poison")]
    safe = lexicon_safe(x[:, 4:], bad)
    brute = torch.tensor([not any(t in bad for t in row) for row in x[:, 4:].tolist()])
    assert torch.equal(safe, brute)


@pytest.fixture(scope="module")
def tiny():
    tok = grammar_tokenizer()
    h = tinygpt_handle(tok, generator=torch.Generator().manual_seed(0), d_model=32, n_layers=2, n_heads=4, max_len=20)
    head = QHead(h.d_model, h.vocab_size, rank=4)
    torch.nn.init.normal_(head.F, std=0.5)
    torch.nn.init.normal_(head.delta, std=2.0)
    prompts = sample_grammar(64, tok, torch.Generator().manual_seed(1))[:, :4]
    return h, head, prompts


def test_tinygpt_tau0_reproduces_base_token_for_token(tiny):
    h, head, prompts = tiny
    with torch.no_grad():
        base = coupled_decode(h, prompts, layer=-1, mode="base", generator=G(7), max_new_tokens=10)
        vf0 = coupled_decode(h, prompts, layer=-1, value_fn=head, mode="vf", tau=0.0, generator=G(7), max_new_tokens=10)
        vf = coupled_decode(h, prompts, layer=-1, value_fn=head, mode="vf", tau=0.5, generator=G(7), max_new_tokens=10)
    assert torch.equal(base["new"], vf0["new"]) and not vf0["intervened"].any()
    differs = (vf["new"] != base["new"]).any(1)
    assert vf["intervened"].any() and (vf["intervened"] | ~differs).all()
    assert torch.equal(vf["new"][~vf["intervened"]], base["new"][~vf["intervened"]])
    assert vf["value_evals"] == vf["steps"] and base["value_evals"] == 0
    hs, taken, rows = rollout_features(h, prompts, base["new"], -1)
    assert hs.shape == (len(taken), h.d_model) and taken.shape == rows.shape


def test_bad_input_raises_before_generation(tiny):
    h, head, prompts = tiny
    with pytest.raises(ParameterError, match="tau"):
        resolve(PRESETS, "smoke", tau=1.5)
    with pytest.raises(ParameterError, match="scorer"):
        resolve(PRESETS, "smoke", scorer="oracle")
    with pytest.raises(ParameterError, match="layer"):
        check_decode_inputs(h, 7, 0.2)
    with pytest.raises(ParameterError, match="tau"):
        coupled_decode(h, prompts, layer=-1, value_fn=head, tau=-0.1, generator=G(0))
    with pytest.raises(ParameterError, match="scorer"):
        make_judge("oracle")


def test_smollm2_one_filtered_step():
    from genlab.lm import load_smollm2
    h = load_smollm2()
    with pytest.raises(ParameterError, match="layer"):
        check_decode_inputs(h, 30, 0.2)
    head = QHead(h.d_model, h.vocab_size, rank=2)
    torch.nn.init.normal_(head.delta, std=3.0)                # random values: some tokens filtered at tau = 0.5
    p = h.chat_prompt("Write one sentence about a farm.")[None].repeat(2, 1)
    with torch.no_grad():
        base = coupled_decode(h, p, layer=20, mode="base", generator=G(3), max_new_tokens=2)
        vf0 = coupled_decode(h, p, layer=20, value_fn=head, mode="vf", tau=0.0, generator=G(3), max_new_tokens=2)
        vf = coupled_decode(h, p, layer=20, value_fn=head, mode="vf", tau=0.5, generator=G(3), max_new_tokens=1)
    assert torch.equal(base["new"], vf0["new"]) and vf0["value_evals"] == vf0["steps"] == 2
    with torch.no_grad():
        hid = h.hidden(p, [20])[20][:, -1]
    allowed = head(hid) >= 0.5
    assert allowed.gather(1, vf["new"][:, :1]).all() or vf["forced"].all()   # the emitted token passed the filter
    assert vf["value_evals"] == 1


def _batched_vs_alone(h, head, prompts, seeds, n, new_tokens, **kw):
    "coupled_decode of a left-padded batch (n rows per prompt, one seed per prompt) against each prompt alone."
    from genlab.lm import Batch
    batch = h.pad([p for p in prompts for _ in range(n)])
    with torch.no_grad():
        both = coupled_decode(h, batch, layer=-1, value_fn=head, generator=[G(s) for s in seeds], max_new_tokens=new_tokens, **kw)
        for i, (p, s) in enumerate(zip(prompts, seeds)):
            alone = coupled_decode(h, p[None].repeat(n, 1), layer=-1, value_fn=head, generator=G(s),
                                   max_new_tokens=new_tokens, **kw)
            sl = slice(i * n, (i + 1) * n)
            assert torch.equal(both["new"][sl], alone["new"]), i
            assert torch.equal(both["intervened"][sl], alone["intervened"]) and torch.equal(both["n_tok"][sl], alone["n_tok"])
        hs_b, tk_b, rw_b = rollout_features(h, batch, both["new"], -1)
        sl = slice(0, n)
        hs_a, tk_a, _ = rollout_features(h, prompts[0][None].repeat(n, 1), both["new"][sl], -1)
        m = rw_b < n
        assert torch.equal(tk_b[m], tk_a) and torch.allclose(hs_b[m], hs_a, atol=1e-4 * hs_a.abs().max().item())


def test_coupled_decode_batches_prompts_of_different_lengths(tiny):
    h, head, prompts = tiny
    ps = [prompts[0], prompts[1, 1:], prompts[2, 2:]]            # lengths 4, 3, 2
    _batched_vs_alone(h, head, ps, [7, 8, 9], n=3, new_tokens=8, mode="vf", tau=0.5)
    with pytest.raises(ParameterError, match="generator"):
        coupled_decode(h, prompts[:4], layer=-1, mode="base", generator=[G(1), G(2), G(3)])


def test_smollm2_coupled_decode_batched_equals_per_prompt():
    from genlab.lm import load_smollm2
    h = load_smollm2()
    head = QHead(h.d_model, h.vocab_size, rank=2)
    torch.nn.init.normal_(head.delta, std=3.0)
    ps = [h.chat_prompt("Write one sentence about a farm."), h.chat_prompt("Write about the sea, in one long sentence please.")]
    _batched_vs_alone(h, head, ps, [3, 4], n=2, new_tokens=3, mode="vf", tau=0.5, temperature=0.8)


def test_minilm_judge_embeds_with_the_core_loader():
    from genlab.lm import SentenceEmbedder, load_minilm
    from genlab.value_filter import make_judge
    j = make_judge("minilm", phrases=["a cow in the barn", "a quiet beach"], unsafe=[1, 0])
    assert isinstance(j.embed, SentenceEmbedder)
    texts = ["Cows and sheep graze near the barn.", "The beach has white sand."]
    assert torch.equal(j.embed(texts), load_minilm()(texts))


def test_world_a_grading_lets_the_filter_remove_safe_tokens():
    w = markov_world()
    W = exact_values(w["P"], w["unsafe"], w["eos"], 12)
    assert torch.allclose(w["P"].sum(1), torch.ones(w["V"], dtype=torch.float64))
    g = grading_report(W, w)
    assert g["min_safe"] < 0.1                                   # a safe token below every tau >= 0.1
    assert g["danger"][0] < 0.15 and g["danger"][1] < 0.5 and g["risky"][0] < 0.5 and g["neutral"][1] > 0.99
    old = markov_world(grading="ungraded")
    Wo = exact_values(old["P"], old["unsafe"], old["eos"], 12)
    assert grading_report(Wo, old)["min_safe"] > 0.5             # the ablation: the filter at tau <= 0.5 only bans unsafe tokens
    # with the graded world, VF at tau = 0.3 makes false interventions (the bound is exercised), and stays within it
    r = simulate_markov(w, W, n=40_000, horizon=12, generator=torch.Generator().manual_seed(0), tau=0.3)
    st = coupling_stats(r["base_safe"], r["out_safe"], r["intervened"], r["differs"], tau=0.3)
    assert st["fi"] > 10 * st["se_fi"] and st["slack"] < 0
    ro = simulate_markov(old, Wo, n=40_000, horizon=12, generator=torch.Generator().manual_seed(0), tau=0.3)
    assert coupling_stats(ro["base_safe"], ro["out_safe"], ro["intervened"], ro["differs"])["fi"] == 0


def test_value_before_appending_is_the_bug_control():
    w = markov_world()
    W = exact_values(w["P"], w["unsafe"], w["eos"], 12)
    g = lambda: torch.Generator().manual_seed(2)
    ok = simulate_markov(w, W, n=20_000, horizon=12, generator=g(), tau=0.3)
    bug = simulate_markov(w, W, n=20_000, horizon=12, generator=g(), tau=0.3, timing="before")
    hi = W[0, ok["start"]] >= 0.3
    assert ok["out_safe"][hi].all()                              # V2: never unsafe from V(x) >= tau
    assert (~bug["out_safe"][hi]).double().mean() > 0.05         # unsafe tokens stay allowed


def test_compositional_judge_by_brute_force():
    tok = grammar_tokenizer()
    trig = [tok.stoi[w] for w in GRAMMAR["trigger"]]
    pay = [tok.stoi[w] for w in GRAMMAR["payload"]]
    x = sample_grammar(2000, tok, torch.Generator().manual_seed(0), max_response=14)[:, 4:]
    safe = judge_b(x, trig, pay)
    brute = torch.tensor([not any(a in trig and b in pay for i, a in enumerate(r) for b in r[i + 1:]) for r in x.tolist()])
    assert torch.equal(safe, brute)
    assert torch.equal(judge_b(x, trig, pay, "lexical"), lexicon_safe(x, pay))
    has_pay = torch.isin(x, torch.tensor(pay)).any(1)
    frac = (has_pay & safe).double().sum() / safe.sum()
    assert 0.08 < frac < 0.25 and 0.1 < 1 - safe.double().mean() < 0.35   # harmless payloads; unsafe rate in range
    assert (x == tok.eos_id).cumsum(1).clamp(max=1).sum(1).ge(1).all()
    with pytest.raises(ParameterError, match="judge_b"):
        judge_b(x, trig, pay, "any")


def test_lexicon_ban_is_vf_with_a_zero_one_value():
    n, V = 5000, 6
    logp = torch.log_softmax(torch.randn(n, V, generator=torch.Generator().manual_seed(0)), -1)
    g = gumbel((n, V), torch.Generator().manual_seed(1))
    ban = lexicon_values([2, 5], V).expand(n, V)
    tok, iv, fo = filter_step(logp, ban, g, 0.5)
    base = (logp + g).argmax(-1)
    assert not torch.isin(tok, torch.tensor([2, 5])).any() and not fo.any()
    assert torch.equal(iv, torch.isin(base, torch.tensor([2, 5])))             # intervenes exactly on listed base tokens
    assert torch.equal(tok[~iv], base[~iv])


def test_tied_qhead_gives_unseen_tokens_distinct_values():
    g = torch.Generator().manual_seed(0)
    emb = torch.randn(12, 6, generator=g)
    tied = QHead(4, 12, rank=3, kind="tied", emb=emb)
    free = QHead(4, 12, rank=3, kind="free")
    h = torch.randn(64, 4, generator=g)
    taken = torch.randint(0, 8, (64,), generator=g)               # tokens 8..11 are never taken
    y = (taken % 2 == 0).float()
    for head in (tied, free):
        train = torch.optim.Adam(head.parameters(), lr=0.05)
        for _ in range(100):
            train.zero_grad(); qhead_bce(head, h, taken, y).backward(); train.step()
    with torch.no_grad():
        vt, vf = tied.logits(h[:1])[0], free.logits(h[:1])[0]   # value logits (sigmoid may saturate)
    assert (vt[8:, None] - vt[None, 8:]).abs().add(torch.eye(4)).min() > 1e-3   # distinct through their embeddings
    assert torch.allclose(vf[8:], vf[8:9].expand(4))                         # the free head: all unseen tokens alike
    # logits_at is the gather of logits (the masked BCE of Eq. 6 reads the same numbers the filter uses)
    idx = torch.randint(0, 12, (64,), generator=g)
    for head in (tied, free):
        assert torch.allclose(head.logits_at(h, idx), head.logits(h).gather(1, idx[:, None])[:, 0], atol=1e-5)
    # the tied head's gradient never reaches the frozen unembedding; it must match the vocabulary
    assert not tied.E.requires_grad
    with pytest.raises(ParameterError, match="tied"):
        QHead(4, 12, kind="tied", emb=torch.randn(10, 6))
    sh = shuffled_values(tied, torch.arange(12).flip(0))
    assert torch.allclose(sh(h[:2]), tied(h[:2]).flip(-1))


def test_touched_rows_are_the_only_rows_vf_changes(tiny):
    h, _, prompts = tiny
    head = make_qhead(h, "tied", rank=4)
    torch.nn.init.normal_(head.c, std=1.0)
    assert torch.equal(head.E, (unembedding(h) - unembedding(h).mean(0)) / unembedding(h).std())
    with torch.no_grad():
        base = coupled_decode(h, prompts, layer=-1, mode="base", generator=[G(i) for i in range(64)], max_new_tokens=10)
        vf = coupled_decode(h, prompts, layer=-1, value_fn=head, mode="vf", tau=0.5, generator=[G(i) for i in range(64)], max_new_tokens=10)
        hs, taken, rows = rollout_features(h, prompts, base["new"], -1)
        touch = touched_rows(torch.sigmoid(head.logits_at(hs, taken)), rows, 64, 0.5)
    assert 0 < touch.sum() < 64
    assert torch.equal(touch, vf["intervened"])                  # intervened iff the base run meets a low-value token
    assert torch.equal(vf["new"][~touch], base["new"][~touch])
    # per-row seeds: a subset decoded alone reproduces the same rows of the full batch
    idx = touch.nonzero()[:, 0]
    with torch.no_grad():
        sub = coupled_decode(h, prompts[idx], layer=-1, value_fn=head, mode="vf", tau=0.5, generator=[G(i) for i in idx.tolist()], max_new_tokens=10)
    assert torch.equal(sub["new"], vf["new"][idx])


def test_pareto_levels_brute_force():
    vf = [(0.10, 0.05), (0.05, 0.10), (0.01, 0.30)]
    base = [(0.10, 0.20), (0.05, 0.02), (0.0, 0.5)]
    won = pareto_levels_won(vf, base, [0.1, 0.05, 0.02, 0.001])
    # level 0.1: VF (0.10, 0.05) vs baselines with unsafe <= 0.105: (0.05, 0.02) is lower by 0.03 -> lost
    # level 0.05: VF (0.05, 0.10); (0.05, 0.02) lower -> lost; level 0.02: VF (0.01, 0.30); (0.0, 0.5) not lower -> won
    # level 0.001: no VF point -> lost
    assert won == [False, False, True, False]


def test_calibration_helpers():
    assert expected_calibration_error([0.2, 0.2, 0.8, 0.8], [0.2, 0.2, 0.8, 0.8]) == pytest.approx(0.0)
    assert expected_calibration_error([0.9] * 4, [0, 0, 1, 1]) == pytest.approx(0.4)


def test_qhead_initial_weights_come_from_the_generator():
    emb = torch.randn(12, 6)
    a, b = (QHead(4, 12, rank=3, kind="tied", emb=emb, generator=G("qhead")) for _ in range(2))
    c = QHead(4, 12, rank=3, kind="tied", emb=emb, generator=G("other"))
    assert all(torch.equal(x, y) for x, y in zip(a.parameters(), b.parameters()))
    assert not torch.equal(a.U.weight, c.U.weight)
    # nn.Linear's default law U(-1/sqrt(fan_in), 1/sqrt(fan_in)): a Kolmogorov-Smirnov test on a wide layer
    w = QHead(400, 5, rank=64, generator=G("ks")).U.weight.detach().flatten().numpy()
    assert stats.kstest(w, stats.uniform(loc=-0.05, scale=0.1).cdf).pvalue > 1e-3


def test_smollm2_prompts_and_lexicon():
    ps = smol_prompts()
    assert len(ps) == len(set(ps)) >= 350                        # 150 training + 200 test prompts, disjoint
    j = LexiconJudge(["cat", "fox", "puppy"])
    assert j.safe(["The category is wide.", "A cats' party", "Foxes run.", "My puppy!", "Puppies"]).tolist() == [True, False, False, False, True]
    tok = grammar_tokenizer()
    assert lexicon_token_ids(tok, ["kill", "bomb"], word_start=False) == sorted([tok.stoi["kill"], tok.stoi["bomb"]])


def test_presets_and_sections():
    full = PRESETS["full"]
    assert full.sections == ("world_a", "world_b", "smollm2") and full.a_seeds >= 5 and full.b_seeds >= 3 and full.smol_seeds >= 3
    assert 0.5 in full.taus and 0.7 in full.taus and {0.5, 0.7} <= set(full.a_taus) and full.qhead == "tied"
    with pytest.raises(ParameterError, match="taus"):
        resolve(PRESETS, "smoke", taus=(0.0, 0.3))
    with pytest.raises(ParameterError, match="section"):
        resolve(PRESETS, "smoke", section="world_c")
