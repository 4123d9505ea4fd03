"""Unit tests for genlab.value_filter: closed forms, brute force, Monte Carlo and chi-square oracles."""
import itertools
import math
import os

import numpy as np
import pytest
import torch
from scipy import stats

from genlab.core import ParameterError, resolve
from genlab.lm import tinygpt_handle
from genlab.value_filter import (PRESETS, QHead, bound_fi, check_decode_inputs, coupled_decode, coupling_stats,
                                 exact_values, filter_step, grammar_tokenizer, gumbel, lexicon_safe, make_judge,
                                 markov_world, qhead_bce, rollout_features, sample_grammar, simulate_markov,
                                 token_edit_distance)

torch.set_num_threads(1)
H = 6


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
        base = coupled_decode(h, prompts, layer=-1, mode="base", seed=7, max_new_tokens=10)
        vf0 = coupled_decode(h, prompts, layer=-1, value_fn=head, mode="vf", tau=0.0, seed=7, max_new_tokens=10)
        vf = coupled_decode(h, prompts, layer=-1, value_fn=head, mode="vf", tau=0.5, seed=7, max_new_tokens=10)
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
        coupled_decode(h, prompts, layer=-1, value_fn=head, tau=-0.1)
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
        base = coupled_decode(h, p, layer=20, mode="base", seed=3, max_new_tokens=2)
        vf0 = coupled_decode(h, p, layer=20, value_fn=head, mode="vf", tau=0.0, seed=3, max_new_tokens=2)
        vf = coupled_decode(h, p, layer=20, value_fn=head, mode="vf", tau=0.5, seed=3, max_new_tokens=1)
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
        both = coupled_decode(h, batch, layer=-1, value_fn=head, seed=seeds, max_new_tokens=new_tokens, **kw)
        for i, (p, s) in enumerate(zip(prompts, seeds)):
            alone = coupled_decode(h, p[None].repeat(n, 1), layer=-1, value_fn=head, seed=s,
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
    with pytest.raises(ParameterError, match="seed"):
        coupled_decode(h, prompts[:4], layer=-1, mode="base", seed=[1, 2, 3])


def test_smollm2_coupled_decode_batched_equals_per_prompt():
    from genlab.lm import load_smollm2
    h = load_smollm2()
    head = QHead(h.d_model, h.vocab_size, rank=2)
    torch.nn.init.normal_(head.delta, std=3.0)
    ps = [h.chat_prompt("Write one sentence about a farm."), h.chat_prompt("Write about the sea, in one long sentence please.")]
    _batched_vs_alone(h, head, ps, [3, 4], n=2, new_tokens=3, mode="vf", tau=0.5, temperature=0.8)


def test_minilm_embedder_is_the_core_loader():
    from genlab.lm import SentenceEmbedder, load_minilm
    from genlab.value_filter import minilm_embedder
    e = minilm_embedder()
    assert isinstance(e, SentenceEmbedder)
    texts = ["Cows and sheep graze near the barn.", "The beach has white sand."]
    assert torch.equal(e(texts), load_minilm()(texts))
