"Unit tests of genlab.shiftrag with independent oracles (closed forms, numpy, brute force)."
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from genlab.core import ParameterError, resolve
from genlab.shiftrag import (PRESETS, GenData, ModeAdapters, RetrievalHeads, SoftProjector, TextBank, alignment_features,
                             article_split, derangement, effective_rank, encode_bank, gen_forward, gen_sequences,
                             head_reads, ict_collection, info_nce, kb_questions, kb_tokenizer, make_kb, mine_hard,
                             orth_gen_penalty, orth_ret_penalty, pretrained_backbone, rank_of_gold, retrieval_metrics,
                             splice_soft, split_sentences, train_generator, train_retriever)

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def world():
    kb = make_kb(30, 3)
    tok = kb_tokenizer(kb)
    h, _ = pretrained_backbone(kb, tok, seed=0, d_model=32, n_layers=2, n_heads=2, steps=3, batch=4)
    return kb, tok, h


def test_effective_rank_closed_forms_and_numpy_oracle():
    assert effective_rank(torch.eye(7), centre=False) == pytest.approx(7, abs=1e-6)
    assert effective_rank(torch.outer(torch.randn(9), torch.randn(4)), centre=False) == pytest.approx(1, abs=1e-6)
    X = torch.randn(40, 6, generator=torch.Generator().manual_seed(0))
    Xc = X.double().numpy() - X.double().numpy().mean(0)
    s = np.linalg.svd(Xc, compute_uv=False); p = s / s.sum()
    assert effective_rank(X) == pytest.approx(float(np.exp(-(p * np.log(p)).sum())), rel=1e-9)


def test_info_nce_closed_form_and_gradient():
    B, gap, kappa = 6, 0.4, 0.05
    sc = (torch.full((B, B), 1 - gap) + gap * torch.eye(B)) / kappa
    assert float(info_nce(sc, torch.arange(B))) == pytest.approx(math.log(1 + (B - 1) * math.exp(-gap / kappa)), abs=1e-5)
    x = torch.randn(4, 5, dtype=torch.double, requires_grad=True)
    t = torch.tensor([0, 2, 1, 4])
    assert torch.autograd.gradcheck(lambda z: info_nce(z, t), (x,))


def test_orthogonality_penalties():
    Q, _ = torch.linalg.qr(torch.randn(8, 8, dtype=torch.double))
    assert float(orth_gen_penalty(Q[:5][None])) == pytest.approx(0, abs=1e-12)
    assert float(orth_gen_penalty(torch.ones(2, 4, 3))) > 0.5
    E = torch.randn(20, 5, dtype=torch.double)
    Eh = E.numpy() - E.numpy().mean(0); Eh /= np.linalg.norm(Eh, axis=1, keepdims=True)
    want = np.sum((Eh.T @ Eh / 20 - np.eye(5) / 5) ** 2)
    assert float(orth_ret_penalty(E)) == pytest.approx(want, rel=1e-9)


def test_rank_metrics_brute_force():
    g = torch.Generator().manual_seed(1)
    s = torch.randn(30, 12, generator=g)
    gold = torch.randint(12, (30,), generator=g)
    ranks = rank_of_gold(s, gold)
    brute = [1 + sorted(s[i].tolist(), reverse=True).index(float(s[i, gold[i]])) for i in range(30)]
    assert ranks.tolist() == brute
    m = retrieval_metrics(ranks)
    assert m["R@1"] == pytest.approx(np.mean(np.array(brute) == 1)) and m["MRR"] == pytest.approx(np.mean(1 / np.array(brute)))


def test_kb_deterministic_gold_unique_and_twins():
    a, b = make_kb(80, 5), make_kb(80, 5)
    assert a.docs == b.docs and a.questions == b.questions and make_kb(80, 6).values != a.values
    for e, k in enumerate(a.kind):
        if k == "reversed":
            p = a.partner[e]
            assert a.names[e] == (a.names[p][1], a.names[p][0]) and a.names[e] != a.names[p]
    for q in a.questions:
        if q["split"] != "test":
            continue
        if q["hop"] == 1:   # exactly one fact document of this entity and attribute, holding the answer
            facts = [i for i, d in enumerate(a.docs) if a.doc_kind[i] == "fact" and a.doc_entity[i] == q["entity"] and a.doc_attr[i] == q["attr"]]
            assert facts == [q["gold"]] and q["answer"] in a.docs[q["gold"]].split()
        else:               # a unique 2-hop chain
            hits = [e for e in range(80) if a.values["city"][e] in q["text"].split() and a.values["job"][e] in q["text"].split()]
            assert hits == [q["entity"]]
    assert {a.split[q["entity"]] for q in kb_questions(a, "test")} == {"test"}


def test_mode_adapters_exact_toggle_and_disjoint(world):
    kb, tok, h = world
    ads = ModeAdapters(h)
    r, g = ads.add("ret"), ads.add("gen")
    with torch.no_grad():
        for p in list(r.B) + list(g.B):
            p.normal_()
    ids = h.encode(kb.docs[:5])
    base = h.logits(ids)
    with ads.use(None):
        assert torch.equal(h.logits(ids), base)
    with ads.use("ret"):
        lr_ = h.logits(ids)
    with ads.use("gen"):
        lg = h.logits(ids)
    assert not torch.equal(lr_, base) and not torch.equal(lg, base) and not torch.equal(lr_, lg)
    assert torch.equal(h.logits(ids), base)
    with pytest.raises(ParameterError):
        with ads.use("nope"):
            pass


def test_splice_places_soft_tokens_and_equals_ids_forward(world):
    kb, tok, h = world
    qs = kb_questions(kb, "test")[:3]
    top = torch.tensor([[0, 1], [2, 3], [4, 5]])
    seqs, _ = gen_sequences(tok, kb, qs, top, "text", 2)
    from genlab.lm import pad_sequences
    pb = pad_sequences(seqs, tok.pad_id, "left")
    E = splice_soft(h, pb.ids, tok.stoi["<soft>"], None)
    assert torch.equal(h.logits(inputs_embeds=E, attention_mask=pb.attention_mask), h.logits(pb.ids, pb.attention_mask))
    seqs, _ = gen_sequences(tok, kb, qs, top, "soft_text", 2)
    pb = pad_sequences(seqs, tok.pad_id, "left")
    S = torch.randn(3, 4, h.d_model)
    E = splice_soft(h, pb.ids, tok.stoi["<soft>"], S)
    for i in range(3):
        pos = torch.nonzero(pb.ids[i] == tok.stoi["<soft>"])[:, 0]
        assert torch.equal(E[i, pos], S[i])
        other = pb.ids[i] != tok.stoi["<soft>"]
        assert torch.equal(E[i, other], h.embed(pb.ids[i:i + 1])[0, other])
    with pytest.raises(ParameterError):
        splice_soft(h, pb.ids, tok.stoi["<soft>"], torch.randn(3, 3, h.d_model))


def _small_setup(world, steps=4):
    kb, tok, h = world
    ads = ModeAdapters(h)
    ads.add("ret", generator=torch.Generator().manual_seed(0)); ads.add("gen", generator=torch.Generator().manual_seed(1))
    q1 = kb_questions(kb, "train", hop=1)
    qb, db = TextBank(tok, [q["text"] for q in q1], "query:"), TextBank(tok, kb.docs, "doc:")
    gold = torch.tensor([q["gold"] for q in q1])
    heads = RetrievalHeads(h.d_model, 8, head_reads("mixed", h.n_layers), generator=torch.Generator().manual_seed(2))
    return kb, tok, h, ads, qb, db, gold, heads


def test_soft_tokens_change_output_and_grad_reaches_only_generation_side(world):
    kb, tok, h, ads, qb, db, gold, heads = _small_setup(world)
    qs = kb_questions(kb, "train")[:6]
    eq = encode_bank(ads, "ret", heads, TextBank(tok, [q["text"] for q in qs], "query:"))
    ed = encode_bank(ads, "ret", heads, db)
    top, feats = alignment_features(heads, eq, ed, 2)
    proj = SoftProjector(feats.shape[-1], h.d_model, 2, 1.0)
    data = GenData(tok, kb, qs, top, feats, "soft_text", 2)
    lg1, S, ans = gen_forward(ads, "gen", proj, data, torch.arange(6), grad=True)
    F.cross_entropy(lg1, ans).backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in proj.parameters())
    assert all(p.grad is None or p.grad.abs().sum() == 0 for p in ads.adapters["ret"].parameters())
    assert all(p.grad is None for p in heads.parameters())
    assert all(p.grad is None for p in h.model.parameters())
    data2 = GenData(tok, kb, qs, top, feats[derangement(6, torch.Generator().manual_seed(0))], "soft_text", 2)
    lg2, _, _ = gen_forward(ads, "gen", proj, data2, torch.arange(6))
    assert not torch.allclose(lg1.detach(), lg2)      # the soft tokens change the output


def test_exact_decoupling_and_joint_weight_zero_is_bitwise(world):
    kb, tok, h, ads, qb, db, gold, heads = _small_setup(world)
    probe = h.encode(kb.docs[:4])
    with ads.use("gen"):
        before = h.logits(probe)
    train_retriever(ads, "ret", heads, qb, gold, db, steps=3, batch=8, lr=1e-2, generator=torch.Generator().manual_seed(5),
                    n_hard=2, remine_every=2)
    with ads.use("gen"):
        assert torch.equal(h.logits(probe), before)      # G1
    emb_a = encode_bank(ads, "ret", heads, db)
    # the same retrieval run with a zero-weighted joint generation loss on a second adapter reproduces it bitwise (G2)
    ads.add("joint", generator=torch.Generator().manual_seed(0))
    heads2 = RetrievalHeads(h.d_model, 8, head_reads("mixed", h.n_layers), generator=torch.Generator().manual_seed(2))
    ads2_heads_init = heads2.W.detach().clone()
    heads_ref = RetrievalHeads(h.d_model, 8, head_reads("mixed", h.n_layers), generator=torch.Generator().manual_seed(2))
    assert torch.equal(ads2_heads_init, heads_ref.W)
    proj = SoftProjector(3, h.d_model, 1, 1.0)
    qs = kb_questions(kb, "train")[:8]
    gdata = GenData(tok, kb, qs, torch.zeros(8, 1, dtype=torch.long), torch.randn(8, 1, 3), "soft_text", 1)
    joint = lambda step, state: F.cross_entropy(*[gen_forward(ads, "joint", proj, gdata, torch.arange(8), grad=True)[i] for i in (0, 2)])
    # ShiftRAG arm on a fresh adapter with the same initialisation as "joint"
    ads.add("ret2", generator=torch.Generator().manual_seed(0))
    train_retriever(ads, "ret2", heads_ref, qb, gold, db, steps=3, batch=8, lr=1e-2, generator=torch.Generator().manual_seed(5),
                    n_hard=2, remine_every=2)
    train_retriever(ads, "joint", heads2, qb, gold, db, steps=3, batch=8, lr=1e-2, generator=torch.Generator().manual_seed(5),
                    n_hard=2, remine_every=2, joint=joint, joint_weight=0.0, joint_params=list(proj.parameters()))
    assert torch.equal(encode_bank(ads, "ret2", heads_ref, db), encode_bank(ads, "joint", heads2, db))
    train_retriever(ads, "joint", heads2, qb, gold, db, steps=2, batch=8, lr=1e-2, generator=torch.Generator().manual_seed(5),
                    n_hard=2, remine_every=2, joint=joint, joint_weight=1.0, joint_params=list(proj.parameters()))
    with ads.use("joint"):
        assert (h.logits(probe) - before).abs().max() > 1e-4   # a shared adapter moves generation (G1 can fail)
    assert torch.equal(encode_bank(ads, "ret", heads, db), emb_a)


def test_mine_hard_never_returns_gold_and_derangement():
    g = torch.Generator().manual_seed(0)
    heads = RetrievalHeads(4, 3, [0], generator=g)
    eq, ed = heads.embed(torch.randn(10, 1, 4)), heads.embed(torch.randn(20, 1, 4))
    gold = torch.randint(20, (10,), generator=g)
    hard = mine_hard(eq, ed, heads, gold, 3, g)
    assert hard.shape == (10, 3) and not (hard == gold[:, None]).any()
    p = derangement(9, g)
    assert sorted(p.tolist()) == list(range(9)) and not (p == torch.arange(9)).any()


def test_variants_have_equal_parameter_counts():
    mixed = RetrievalHeads(16, 8, head_reads("mixed", 4))
    copies = RetrievalHeads(16, 8, head_reads("last_copies", 4))
    assert sum(p.numel() for p in mixed.parameters()) == sum(p.numel() for p in copies.parameters())
    assert copies.reads == [3, 3, 3, 3] and head_reads("last", 4) == [3]


def test_ict_construction():
    arts = ["Alpha one is here. Beta two is there. Gamma three goes on. Delta four stops now. Eps five ends it.",
            "Zeta six starts it. Eta seven is next. Theta eight follows on. Iota nine is last.",
            "Kappa ten is first. Lambda eleven comes after. Mu twelve is the end."]
    c = ict_collection(arts * 3, data_seed=0)
    for q, p in zip(c["queries"], c["passages"]):
        assert q not in p and q in " ".join(arts)
    assert len(split_sentences(arts[0])) == 5
    tr = article_split(c["article"], 0)
    assert not set(c["article"][tr]) & set(c["article"][~tr])
    with pytest.raises(ParameterError):
        ict_collection([])


def test_bad_input_is_rejected_before_work(world):
    kb, tok, h = world
    with pytest.raises(ParameterError):
        resolve(PRESETS, "smoke", k=0)
    with pytest.raises(ParameterError):
        resolve(PRESETS, "smoke", ret_steps=10, gen_steps=20)
    with pytest.raises(ParameterError):
        resolve(PRESETS, "smoke", pool="max")
    with pytest.raises(ParameterError):
        make_kb(0, 0)
    with pytest.raises(ParameterError):
        TextBank(tok, [], "query:")
    with pytest.raises(ParameterError):
        gen_sequences(tok, kb, [], None, "text", 2)
    heads = RetrievalHeads(4, 3, [0])
    with pytest.raises(ParameterError):
        alignment_features(heads, heads.embed(torch.randn(2, 1, 4)), heads.embed(torch.randn(3, 1, 4)), k=5)


def test_orthogonality_penalty_is_wired_and_detached_control_is_not(world):
    kb, tok, h, ads, qb, db, gold, heads = _small_setup(world)
    qs = kb_questions(kb, "train")[:8]
    eq = encode_bank(ads, "ret", heads, TextBank(tok, [q["text"] for q in qs], "query:"))
    top, feats = alignment_features(heads, eq, encode_bank(ads, "ret", heads, db), 2)
    data = GenData(tok, kb, qs, top, feats, "soft_text", 2)
    after = {}
    for name, lam, det in (("none", 0.0, False), ("detached", 0.1, True), ("penalty", 0.1, False)):
        torch.manual_seed(0)
        proj = SoftProjector(feats.shape[-1], h.d_model, 2, 1.0)
        mode = f"gen_{name}"
        ads.add(mode, generator=torch.Generator().manual_seed(1))
        train_generator(ads, mode, proj, data, steps=2, batch=4, lr=1e-2, generator=torch.Generator().manual_seed(3),
                        lambda_g=lam, detach_penalty=det)
        after[name] = torch.cat([p.detach().reshape(-1) for p in proj.parameters()])
    assert torch.equal(after["none"], after["detached"])          # the detached copy adds no gradient
    assert not torch.equal(after["none"], after["penalty"])       # the penalty does
