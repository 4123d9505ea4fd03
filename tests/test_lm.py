import pytest
import torch

from genlab.core import ParameterError
from genlab.lm import (CharTokenizer, LMHandle, TinyGPT, TinyGPTConfig, WordTokenizer, _load_smollm2_gguf,
                       load_smollm2, lm_loss, tinygpt_handle, train_tinygpt)


@pytest.fixture(scope="module")
def tiny():
    tok = WordTokenizer([f"w{i}" for i in range(10)])
    return tinygpt_handle(tok, generator=torch.Generator().manual_seed(0), d_model=32, n_layers=3, n_heads=4, max_len=16)


@pytest.fixture(scope="module")
def smol(tmp_path_factory):
    return load_smollm2()


def test_tinygpt_handle_interface(tiny):
    assert tiny.n_layers == 3 and tiny.d_model == 32 and len(tiny.layers) == 3
    ids = tiny.encode("w1 w2 w3")
    assert ids.tolist() == [5, 6, 7] and tiny.decode(ids) == "w1 w2 w3"
    assert tiny.logits(ids).shape == (1, 3, tiny.vocab_size)


def test_tinygpt_is_causal(tiny):
    ids = torch.tensor([[4, 5, 6, 7, 8]])
    alt = ids.clone(); alt[0, -1] = 9
    assert torch.equal(tiny.logits(ids)[:, :4], tiny.logits(alt)[:, :4])


@pytest.mark.parametrize("which", ["tiny", "smol"])
def test_identity_hooks_leave_logits_bit_identical(which, request):
    h = request.getfixturevalue(which)
    ids = h.encode("w1 w2 w3 w4" if which == "tiny" else "The quick brown fox jumps")
    base = h.logits(ids)
    with h.patch_residual(1, lambda x: x), h.capture([0, 1, h.n_layers - 1]) as acts:
        same = h.logits(ids)
    assert torch.equal(base, same)
    assert acts.last(1).shape == (1, len(ids), h.d_model)
    # hooks are gone afterwards
    assert all(len(l._forward_hooks) == 0 for l in h.layers)
    assert torch.equal(h.logits(ids), base)


@pytest.mark.parametrize("which", ["tiny", "smol"])
def test_patch_changes_downstream_and_capture_sees_it(which, request):
    h = request.getfixturevalue(which)
    ids = h.encode("w1 w2 w3" if which == "tiny" else "Hello there")
    base = h.logits(ids)
    with h.patch_residual(0, lambda x: x + 1.0), h.capture(0) as acts:
        moved = h.logits(ids)
    assert not torch.equal(base, moved)
    clean = h.hidden(ids, [0])[0]
    assert torch.allclose(acts.last(0), clean + 1.0)


@pytest.mark.parametrize("which", ["tiny", "smol"])
def test_bad_layer_is_named(which, request):
    h = request.getfixturevalue(which)
    with pytest.raises(ParameterError, match=rf"layer must be an int in \[0, {h.n_layers - 1}\]"):
        with h.capture(h.n_layers):
            pass


def test_hook_removed_on_error(tiny):
    with pytest.raises(RuntimeError):
        with tiny.patch_residual(0, lambda x: x * 2):
            raise RuntimeError("inside")
    assert all(len(l._forward_hooks) == 0 for l in tiny.layers)


def test_generate_greedy_and_step_fn(tiny):
    ids = tiny.encode("w1 w2")
    out = tiny.generate(ids, max_new_tokens=4)
    assert out.shape == (1, 6) and torch.equal(out[0, :2], ids)
    # a step_fn that forbids everything but token 5 forces it
    def only5(step, ids_, logits):
        m = torch.full_like(logits, float("-inf")); m[:, 5] = 0
        return logits + m
    out = tiny.generate(ids, max_new_tokens=3, step_fn=only5)
    assert out[0, 2:].tolist() == [5, 5, 5]


def test_train_tinygpt_learns_a_deterministic_sequence():
    tok = WordTokenizer([f"w{i}" for i in range(6)])
    h = tinygpt_handle(tok, generator=torch.Generator().manual_seed(1), d_model=32, n_layers=1, n_heads=2, max_len=8)
    data = torch.tensor([[tok.bos_id] + [tok.stoi[f"w{i}"] for i in range(6)]] * 32)
    hist = train_tinygpt(h.model, data, steps=150, batch_size=16, lr=1e-2, progress=False,
                         generator=torch.Generator().manual_seed(2))
    assert hist.last("nll", 10) < 0.05
    assert h.decode(h.generate(torch.tensor([tok.bos_id]), max_new_tokens=6)[0, 1:]) == "w0 w1 w2 w3 w4 w5"


def test_tinygpt_config_validation():
    with pytest.raises(ParameterError, match="divisible"):
        TinyGPT(TinyGPTConfig(vocab_size=10, d_model=30, n_heads=4))


def test_smollm2_shape_and_greedy_text(smol):
    assert smol.n_layers == 30 and smol.d_model == 576 and smol.vocab_size == 49152
    prompt = smol.chat_prompt("What is the capital of France? Answer in one word.")
    out = smol.generate(prompt, max_new_tokens=6)
    assert "Paris" in smol.decode(out[0, len(prompt):])


def test_smollm2_cache_gives_gguf_logits():
    cached = load_smollm2()
    model, tok = _load_smollm2_gguf()
    ids = cached.encode("Flow matching transports a source to the data.")
    with torch.no_grad():
        ref = model(input_ids=ids[None], use_cache=False).logits
    assert torch.equal(cached.logits(ids), ref)


# ---------------------------------------------------------------------------------------------------
# issue 11: batches, soft tokens, sequence scores, sub-module hooks, adapters, loaders
# ---------------------------------------------------------------------------------------------------
import multiprocessing
import time
from pathlib import Path

import torch.nn.functional as F

from genlab.lm import (Batch, ForwardInfo, ProbeHead, SoftPrompt, cached_folder, gumbel, gumbel_generate,
                       gumbel_noise, load_hf_model, load_minilm, pad_sequences)

PROMPTS = {"tiny": ["w1", "w2 w3 w4 w5", "w6 w7"],
           "smol": ["The capital of France is", "Here is a long sentence about the weather in the mountains, and then",
                    "Once upon a time"]}


@pytest.fixture(scope="module")
def tiny_trained():
    "A TinyGPT trained on counting sequences, so that greedy generations are not constant."
    tok = WordTokenizer([f"w{i}" for i in range(10)])
    h = tinygpt_handle(tok, generator=torch.Generator().manual_seed(3), d_model=32, n_layers=2, n_heads=2, max_len=24)
    g = torch.Generator().manual_seed(4)
    starts = torch.randint(0, 10, (256,), generator=g).tolist()
    data = torch.tensor([[tok.stoi[f"w{(s + 2 * j) % 10}"] for j in range(12)] for s in starts])
    train_tinygpt(h.model, data, steps=150, batch_size=32, lr=3e-3, progress=False, generator=g)
    return h


@pytest.fixture(params=["tiny", "smol"])
def model_and_prompts(request):
    h = request.getfixturevalue("tiny_trained" if request.param == "tiny" else "smol")
    return request.param, h, PROMPTS[request.param]


def test_encode_list_gives_left_padded_batch(model_and_prompts):
    which, h, prompts = model_and_prompts
    b = h.encode(prompts)
    assert isinstance(b, Batch) and b.ids.shape == b.attention_mask.shape
    lens = [len(h.encode(p)) for p in prompts]
    assert b.attention_mask.sum(1).tolist() == lens
    for i, p in enumerate(prompts):            # left padding: every prompt ends at the last column
        assert torch.equal(b.ids[i, -lens[i]:], h.encode(p)) and b.attention_mask[i, :-lens[i]].sum() == 0
    assert [r.tolist() for r in b.unpad()] == [h.encode(p).tolist() for p in prompts]


@pytest.mark.parametrize("side", ["left", "right"])
def test_batched_logits_equal_one_at_a_time(model_and_prompts, side):
    which, h, prompts = model_and_prompts
    b = h.encode(prompts, padding_side=side)
    lb = h.logits(b)
    for i, p in enumerate(prompts):
        alone = h.logits(h.encode(p))[0]
        got = lb[i, b.attention_mask[i].bool()]
        tol = 1e-5 if which == "tiny" else 2e-3 * alone.abs().max().item()
        assert (got - alone).abs().max().item() < tol


def test_batched_greedy_generation_equals_one_at_a_time(model_and_prompts):
    which, h, prompts = model_and_prompts
    n = 8
    b = h.encode(prompts)
    out = h.generate(b, n, stop_at_eos=False)
    assert out.shape == (len(prompts), b.ids.shape[1] + n) and torch.equal(out[:, :b.ids.shape[1]], b.ids)
    for i, p in enumerate(prompts):
        ids = h.encode(p)
        alone = h.generate(ids, n, stop_at_eos=False)[0, len(ids):]
        assert alone.tolist() == out[i, b.ids.shape[1]:].tolist(), (p, h.decode(alone), h.decode(out[i, b.ids.shape[1]:]))


def test_smollm2_issue_example_short_prompt_in_a_batch(smol):
    "The issue's defect: the short prompt alone continues ' Paris.\\n\\nThe answer'; in a batch it must too."
    short = "The capital of France is"
    alone = smol.decode(smol.generate(smol.encode(short), 5, stop_at_eos=False)[0, len(smol.encode(short)):])
    assert alone.startswith(" Paris.")
    b = smol.encode([short, "Write a long paragraph about the history of the Roman empire and its fall."])
    batched = smol.decode(smol.generate(b, 5, stop_at_eos=False)[0, b.ids.shape[1]:])
    assert batched == alone


def test_cached_generation_equals_recomputation(model_and_prompts):
    which, h, prompts = model_and_prompts
    b = h.encode(prompts)
    assert torch.equal(h.generate(b, 6, stop_at_eos=False), h.generate(b, 6, stop_at_eos=False, use_cache=False))


def test_step_fn_sees_ids_so_far(tiny_trained):
    h = tiny_trained
    seen = []

    def fn(step, ids, logits):
        seen.append((step, ids.shape, logits.shape))
        return logits
    b = h.encode(PROMPTS["tiny"])
    h.generate(b, 3, step_fn=fn, stop_at_eos=False)
    t = b.ids.shape[1]
    assert seen == [(s, (3, t + s), (3, h.vocab_size)) for s in range(3)]


def test_tinygpt_generation_beyond_max_len_is_refused(tiny_trained):
    with pytest.raises(ParameterError, match="max_len"):
        tiny_trained.generate(tiny_trained.encode("w1 w2"), 30)


def test_hooks_receive_positions_and_cache_offset(model_and_prompts):
    which, h, prompts = model_and_prompts
    b = h.encode(prompts)
    t, lens = b.ids.shape[1], b.attention_mask.sum(1)
    calls = []

    def fn(x, info):
        assert isinstance(info, ForwardInfo)
        calls.append((x.shape[1], info.offset, info.step, info.position_ids.clone()))
        return x
    with h.patch_residual(1, fn, info=True):
        h.generate(b, 3, stop_at_eos=False)
    assert [c[:3] for c in calls] == [(t, 0, 0), (1, t, 1), (1, t + 1, 2)]
    assert torch.equal(calls[0][3][:, -1], lens - 1)          # the prompt pass: each row counts from its first real token
    for s in (1, 2):
        assert torch.equal(calls[s][3][:, 0], lens - 1 + s)   # decoding steps continue each row's own count


def test_submodule_hooks_decompose_the_block(model_and_prompts):
    "h_i = h_{i-1} + attn_i + mlp_i, and mlp.down_proj(its captured input) = the MLP output."
    which, h, prompts = model_and_prompts
    b = h.encode(prompts)
    with h.capture(0) as prev, h.capture(1) as out, h.capture(1, site="attn") as attn, \
         h.capture(1, site="mlp") as mlp, h.capture(1, site="mlp.down_proj", io="input") as down_in:
        h.logits(b)
    hid = prev.last(0) + attn.last(1) + mlp.last(1)
    assert (hid - out.last(1)).abs().max() < 1e-4 * out.last(1).abs().max()
    with torch.no_grad():
        assert torch.allclose(h.module(1, "mlp.down_proj")(down_in.last(1)), mlp.last(1), atol=1e-5)
    width = 1536 if which == "smol" else 4 * h.d_model
    assert down_in.last(1).shape[-1] == width
    with pytest.raises(ParameterError, match="site"):
        with h.capture(1, site="no_such_module"):
            pass
    assert all(len(m._forward_hooks) == 0 and len(m._forward_pre_hooks) == 0 for m in h.model.modules())


def test_patch_submodule_input(tiny_trained):
    h = tiny_trained
    ids = h.encode("w1 w2 w3")
    with h.patch(0, lambda x: torch.zeros_like(x), site="mlp.down_proj", io="input"), h.capture(0, site="mlp") as mlp:
        h.logits(ids)
    assert torch.allclose(mlp.last(0), h.module(0, "mlp.down_proj").bias.expand_as(mlp.last(0)))


def test_hidden_convention_table_smollm2(smol):
    ids = smol.encode("Layers and norms, one table.")
    hs = smol.model(input_ids=ids[None], output_hidden_states=True, use_cache=False).hidden_states
    L = smol.n_layers
    hid = smol.hidden(ids, include_embeddings=True)
    assert torch.equal(hid["emb"], hs[0])
    for i in range(L - 1):
        assert torch.equal(hid[i], hs[i + 1])
    assert not torch.allclose(hid[L - 1], hs[L])                       # capture(L-1) is before the final norm ...
    normed = smol.hidden(ids, [L - 1], post_norm=True)[L - 1]
    assert torch.allclose(normed, hs[L], atol=1e-5)                    # ... post_norm gives HF's last hidden state
    assert torch.allclose(smol.model.lm_head(normed), smol.logits(ids), atol=1e-4)


def test_hidden_convention_table_tinygpt(tiny_trained):
    h = tiny_trained
    ids = h.encode("w1 w2 w3")
    hid = h.hidden(ids, include_embeddings=True, post_norm=True)
    m = h.model
    assert torch.equal(hid["emb"], m.tok_emb(ids[None]) + m.pos_emb(torch.arange(3)))
    assert torch.allclose(hid[h.n_layers - 1] @ m.tok_emb.weight.T, h.logits(ids), atol=1e-5)


def test_inputs_embeds_equal_ids(model_and_prompts):
    which, h, prompts = model_and_prompts
    b = h.encode(prompts)
    with torch.no_grad():
        e = h.embed(b.ids)
    assert e.shape == (*b.ids.shape, h.d_model)
    assert torch.allclose(h.logits(inputs_embeds=e, attention_mask=b.attention_mask), h.logits(b), atol=1e-4)
    new = h.generate(inputs_embeds=e, attention_mask=b.attention_mask, max_new_tokens=5, stop_at_eos=False)
    assert torch.equal(new, h.generate(b, 5, stop_at_eos=False)[:, b.ids.shape[1]:])
    with pytest.raises(ParameterError, match="inputs_embeds"):
        h.logits(inputs_embeds=torch.zeros(1, 2, h.d_model + 1))


def _hand_seq_logprob(h, ids, start):
    "Σ_{j >= start} log softmax(logits of ids[:j])[ids[j]], one prefix forward at a time."
    total = 0.0
    for j in range(start, len(ids)):
        lg = h.logits(ids[:j])[0, -1].double()
        total += float(torch.log_softmax(lg, -1)[ids[j]])
    return total


def test_seq_logprob_and_loss_against_hand_sum(model_and_prompts):
    which, h, prompts = model_and_prompts
    seqs = [h.encode(p) for p in prompts[1:]]
    starts = [2, 1]                                            # response = ids[start:], the prompt masked out
    b = h.pad(seqs)
    label = torch.zeros_like(b.ids, dtype=torch.bool)
    for i, (s, st) in enumerate(zip(seqs, starts)):
        label[i, b.ids.shape[1] - len(s) + st:] = True
    got = h.seq_logprob(b, label)
    want = torch.tensor([_hand_seq_logprob(h, s, st) for s, st in zip(seqs, starts)], dtype=torch.float64)
    assert torch.allclose(got.double(), want, atol=1e-3 if which == "smol" else 1e-4)
    n_lab = sum(len(s) - st for s, st in zip(seqs, starts))
    assert abs(h.loss(b, label).item() + want.sum().item() / n_lab) < 1e-3
    assert got.requires_grad
    assert abs(lm_loss(h, seqs[1][None]).item() + _hand_seq_logprob(h, seqs[1], 1) / (len(seqs[1]) - 1)) < 1e-3


def test_lm_loss_on_smollm2_handle_and_model(smol):
    ids = smol.encode("A short check that the loss runs.")[None]
    a, b = lm_loss(smol, ids), lm_loss(smol.model, ids)
    assert torch.isfinite(a) and abs(a.item() - b.item()) < 1e-4


def test_tinygpt_with_smollm2_tokenizer(smol):
    st = tinygpt_handle(smol.tokenizer, generator=torch.Generator().manual_seed(0), d_model=32, n_layers=1,
                        n_heads=2, max_len=32)
    assert st.vocab_size == smol.vocab_size and st.eos_id == smol.eos_id
    ids = st.encode("Hello there")
    assert torch.equal(ids, smol.encode("Hello there")) and st.decode(ids) == "Hello there"
    out = st.generate(st.encode(["Hi", "Hello there"]), 3, stop_at_eos=False)
    assert out.shape[1] == 2 + 3                      # "Hello there" has 2 tokens
    assert torch.isfinite(st.loss(smol.encode("Hello there friend")[None]))


def test_load_smollm2_fresh_is_an_independent_copy(smol):
    assert load_smollm2() is smol and smol.shared
    fresh = load_smollm2(fresh=True)
    assert fresh is not smol and not fresh.shared and fresh.model is not smol.model
    ids = smol.encode("Independent copies")
    base = smol.logits(ids)
    assert torch.equal(fresh.logits(ids), base)
    with torch.no_grad():
        fresh.model.model.layers[0].mlp.down_proj.weight.zero_()       # e.g. pruning
    assert not torch.equal(fresh.logits(ids), base)
    assert torch.equal(smol.logits(ids), base) and torch.equal(load_smollm2().logits(ids), base)
    with pytest.raises(ParameterError, match="fresh=True"):
        smol.add_lora(["self_attn.q_proj"])
    del fresh


def _slow_build(folder):
    (folder / "part1").write_text("a" * 1000)
    time.sleep(0.5)
    (folder / "weights.bin").write_text("b" * 1000)
    with open(folder.parent / "builds.log", "a") as f:
        f.write("built\n")


def _load_cached(target, q):
    built = cached_folder(Path(target), _slow_build, marker="weights.bin")
    q.put((built, sorted(p.name for p in Path(target).iterdir()), (Path(target) / "part1").read_text() == "a" * 1000))


def test_cache_write_is_safe_with_two_concurrent_loaders(tmp_path):
    target = tmp_path / "model"
    ctx = multiprocessing.get_context("fork")
    q = ctx.Queue()
    ps = [ctx.Process(target=_load_cached, args=(str(target), q)) for _ in range(2)]
    for p in ps:
        p.start()
    res = [q.get(timeout=30) for _ in ps]
    for p in ps:
        p.join(timeout=30)
    assert sorted(r[0] for r in res) == [False, True]          # built exactly once, the other loader waited
    assert all(r[1] == ["part1", "weights.bin"] and r[2] for r in res)
    assert (tmp_path / "builds.log").read_text() == "built\n"
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".tmp-") or p.name.startswith(".old-")]
    assert cached_folder(target, _slow_build, marker="weights.bin", refresh=True)   # a refresh replaces it whole
    assert (tmp_path / "builds.log").read_text() == "built\nbuilt\n"


def test_smollm2_weights_are_a_q4_1_grid(smol):
    for name in ("self_attn.q_proj", "mlp.down_proj", "mlp.gate_proj"):
        w = smol.module(7, name).weight.reshape(-1, 32)
        counts = torch.tensor([len(torch.unique(r)) for r in w[:2000]])
        assert counts.max() <= 16 and counts.float().mean() > 8


def test_load_hf_model_from_a_local_folder(smol):
    from genlab.lm import cache_dir
    h = load_hf_model(cache_dir() / "smollm2-135m-instruct-f32")
    ids = smol.encode("Any local model folder")
    assert h.n_layers == 30 and torch.equal(h.logits(ids), smol.logits(ids)) and not h.shared
    with pytest.raises(ParameterError, match="does not exist"):
        load_hf_model("/no/such/model")


def test_minilm_loader():
    emb = load_minilm()
    e = emb(["A cat sits on the mat.", "A kitten is sitting on a rug.", "Stock prices fell sharply today."])
    assert e.shape == (3, 384) and torch.allclose(e.norm(dim=1), torch.ones(3), atol=1e-5)
    assert e[0] @ e[1] > e[0] @ e[2] + 0.2


@pytest.mark.parametrize("which", ["tiny", "smol"])
def test_lora_soft_prompt_and_head_train_only_the_additions(which, request):
    if which == "tiny":
        tok = WordTokenizer([f"w{i}" for i in range(10)])
        h = tinygpt_handle(tok, generator=torch.Generator().manual_seed(0), d_model=32, n_layers=2, n_heads=2, max_len=16)
        sites, text, target = ["qkv", "mlp.down_proj"], "w1 w2 w3 w4", "w9"
    else:
        request.getfixturevalue("smol")                              # cache built
        h = load_smollm2(fresh=True)
        sites, text, target = ["self_attn.q_proj", "self_attn.v_proj"], "The colour of the sky is", " green"
    before = {n: p.detach().clone() for n, p in h.backbone_parameters().items()}
    ids = torch.cat([h.encode(text), h.encode(target)])[None]
    base = h.logits(ids)
    params = h.add_lora(sites, layers=[0, 1], r=4, alpha=8)
    assert len(params) == 2 * len(sites) * 2 and all(p.requires_grad for p in params)
    assert not any(p.requires_grad for p in h.backbone_parameters().values())
    assert torch.equal(h.logits(ids), base)                          # B = 0 at initialisation
    soft = SoftPrompt(3, h.d_model, generator=torch.Generator().manual_seed(1))
    head = ProbeHead(h.d_model, 1)
    label = torch.zeros_like(ids, dtype=torch.bool); label[0, -len(h.encode(target)):] = True
    layer = 1

    def loss_fn(step):
        e, m = soft(h.embed(ids), torch.ones_like(ids))
        lg = h.logits(inputs_embeds=e, attention_mask=m, grad=True)[:, 3:]
        lp = torch.log_softmax(lg[:, :-1].float(), -1).gather(-1, ids[:, 1:, None])[..., 0]
        nll = -(lp * label[:, 1:]).sum() / label[:, 1:].sum()
        v = head(h.hidden(ids, [layer], grad=True)[layer][:, -1])
        return {"nll": nll, "probe": F.binary_cross_entropy_with_logits(v[:, 0], torch.ones(1))}

    from genlab.train import fit
    hist = fit(loss_fn, params + list(soft.parameters()) + list(head.parameters()), steps=15, lr=1e-2, progress=False)
    assert hist.losses["nll"][-1] < hist.losses["nll"][0]
    after = h.backbone_parameters()
    assert before.keys() == after.keys() and all(torch.equal(before[n], after[n]) for n in before)   # bit-identical
    trained = h.logits(ids)
    assert not torch.equal(trained, base)
    with h.adapter(enabled=False):
        assert torch.equal(h.logits(ids), base)                      # adapter off = the untouched backbone
    assert torch.equal(h.logits(ids), trained) and all(p.requires_grad for p in params)
    with pytest.raises(ParameterError, match="linear"):
        h.add_lora(["mlp"])


def test_gumbel_is_standard_and_gumbel_max_samples_softmax():
    from scipy import stats
    g = torch.Generator().manual_seed(0)
    x = gumbel((20000,), g).double().numpy()
    assert stats.kstest(x, stats.gumbel_r.cdf).pvalue > 1e-3
    logits = torch.tensor([0.5, -1.0, 2.0, 0.0])
    counts = torch.bincount((logits + gumbel((40000, 4), g)).argmax(-1), minlength=4).numpy()
    assert stats.chisquare(counts, 40000 * logits.double().softmax(0).numpy()).pvalue > 1e-3
    assert gumbel_noise(2, 3, 5, g).shape == (2, 3, 5)


def test_gumbel_generate_couples_and_samples(tiny_trained):
    h = tiny_trained
    g = torch.Generator().manual_seed(5)
    prompt = h.encode(["w1", "w1"])
    noise = gumbel_noise(2, 4, h.vocab_size, g)
    a = gumbel_generate(h, prompt, noise, stop_at_eos=False)
    assert torch.equal(a, gumbel_generate(h, prompt, noise, stop_at_eos=False))      # same noise, same tokens
    # step-0 tokens of many coupled draws follow softmax(logits) (temperature 1)
    n = 4000
    noise = gumbel_noise(n, 1, h.vocab_size, g)
    first = gumbel_generate(h, h.encode("w1")[None].expand(n, 1), noise, stop_at_eos=False)[:, 1]
    p = h.logits(h.encode("w1"))[0, -1].softmax(-1)
    emp = torch.bincount(first, minlength=h.vocab_size).double() / n
    assert (emp - p.double()).abs().max() < 0.03


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_device_argument_and_generation_on_the_model_device():
    tok = WordTokenizer([f"w{i}" for i in range(10)])
    h = tinygpt_handle(tok, generator=torch.Generator().manual_seed(0), d_model=32, n_layers=2, n_heads=2,
                       max_len=16, device="cuda")
    out = h.generate(h.encode(["w1", "w2 w3"]), 4)
    assert out.device.type == "cuda" and h.logits(h.encode("w1")).device.type == "cuda"
    s = load_smollm2(device="cuda")
    assert s.device.type == "cuda" and s is not load_smollm2()
    b = s.encode(PROMPTS["smol"])
    out = s.generate(b, 4, stop_at_eos=False)
    assert out.device.type == "cuda"
    cpu = load_smollm2().generate(b, 4, stop_at_eos=False)
    assert torch.equal(out.cpu(), cpu)


def test_generate_allocates_on_the_model_device():
    "The model on the 'meta' device (shapes only, no data): every tensor generate makes must be on it too (no CUDA needed)."
    tok = WordTokenizer([f"w{i}" for i in range(10)])
    h = tinygpt_handle(tok, generator=torch.Generator().manual_seed(0), d_model=32, n_layers=2, n_heads=2, max_len=16,
                       device="meta")
    assert h.device.type == "meta"
    out = h.generate(h.encode(["w1", "w2 w3"]), 3, stop_at_eos=False)
    assert out.device.type == "meta" and out.shape == (2, 5)
    assert h.logits(h.encode("w1 w2")).device.type == "meta"
