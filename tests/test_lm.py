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
