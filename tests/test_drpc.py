"""Unit tests for genlab.drpc with independent oracles (brute force, closed forms, scipy, hand-written rationales)."""
import itertools
import math
from collections import Counter

import numpy as np
import pytest
import torch
from scipy.stats import entropy as sp_entropy

from genlab.core import ParameterError, np_rng
from genlab.drpc import (CONSTS, FILLERS, PHRASES, PROBLEM_TYPES, SIGMA, Calculator, DRPCConfig, Example, PathBank, PRESETS,
                         ProgrammaticTeacher, QuestionEncoder, abstract, abstract_text, bound_terms, build_bank, cosine,
                         coverage_on, edit_distance, is_valid, make_questions, parse_answer_text,
                         parse_student_answer, spell, structural_entropy, student_answers, student_tokenizer,
                         supervision_entropy, top_p_filter, usage_entropy, valid_paths, verify, prompt_text)
from genlab.core import resolve
from genlab.lm import tinygpt_handle


@pytest.fixture(scope="module")
def world():
    qs = make_questions(800, g=np_rng(0, "test", "questions"))
    enc = QuestionEncoder(qs)
    return qs, enc, enc(qs)


def test_answers_follow_every_valid_strategy(world):
    qs, _, _ = world
    from genlab.drpc import execute_path
    for q in qs:
        answers = {execute_path(p, q.qs)[-1][3] for p in valid_paths(q.ptype)}
        assert answers == {q.answer} and 0 <= q.answer <= 400


def test_abstract_inverts_follow_for_every_valid_pair(world):
    qs, _, _ = world
    T = ProgrammaticTeacher(slip=0.0)
    g = np_rng(0, "test", "teacher", 1)
    for q in qs:
        for p in valid_paths(q.ptype):
            r = T.follow(q, p, g)
            assert abstract(r, q) == p and verify(r, q)


def test_verification_rates(world):
    qs, _, _ = world
    T = ProgrammaticTeacher()
    g = np_rng(0, "test", "teacher", 2)
    sample = [qs[i % len(qs)] for i in range(2000)]
    ok_valid = np.mean([verify(T.follow(q, valid_paths(q.ptype)[0], g), q) for q in sample])
    assert ok_valid >= 1 - T.slip - 0.01
    others = {t.name: [p for u in PROBLEM_TYPES if u.name != t.name for p in u.strategies] for t in PROBLEM_TYPES}
    ok_invalid = np.mean([verify(T.follow(q, others[q.ptype][i % len(others[q.ptype])], g), q) for i, q in enumerate(sample)])
    assert ok_invalid <= 0.15


def test_teacher_parity_fillers_and_phrasing(world):
    qs, _, _ = world
    T = ProgrammaticTeacher()
    g = np_rng(0, "test", "teacher", 3)
    # 16000 rationales: DIV (one type of eight) then has ~2000 steps, so the sampling noise of its per-op
    # total variation (~0.03) sits well below the 0.06 tolerance; at 2000 rationales it was ~0.06 itself
    sample = [qs[i % len(qs)] for i in range(16000)]
    stats = {}
    for name, fn in (("follow", lambda q: T.follow(q, valid_paths(q.ptype)[0], g)), ("freeform", lambda q: T.freeform(q, g)),
                     ("templated", lambda q: T.templated(q, g))):
        fill, steps, phr = 0, 0, {op: Counter() for op in PHRASES}
        for q in sample:
            r = fn(q)
            text = r.text
            fill += sum(text.count(f) for f in FILLERS)
            steps += len(r.steps)
            for op, *_ in r.steps:
                for k, ph in enumerate(PHRASES[op]):
                    if ph in text:
                        phr[op][k] += 1
        stats[name] = (fill / steps, {op: np.array([c[k] for k in range(4)]) / max(1, sum(c.values())) for op, c in phr.items()})
    for a, b in itertools.combinations(stats, 2):
        assert abs(stats[a][0] - stats[b][0]) <= 0.02
        for op in PHRASES:
            pa, pb = stats[a][1][op], stats[b][1][op]
            if pa.sum() and pb.sum():
                assert 0.5 * np.abs(pa - pb).sum() <= 0.06   # per-op total variation (phrases co-occur within a rationale)


def test_teacher_deterministic_given_seed(world):
    qs, _, _ = world
    T = ProgrammaticTeacher()
    a = [T.freeform(q, np_rng(0, "test", "teacher", 7)).text for q in qs[:50]]
    b = [T.freeform(q, np_rng(0, "test", "teacher", 7)).text for q in qs[:50]]
    assert a == b


def test_phi_masks_numbers_and_names(world):
    qs, enc, _ = world
    for t in PROBLEM_TYPES:
        same = [q for q in qs if q.ptype == t.name and q.template == 0][:2]
        assert same[0].qs != same[1].qs
        assert cosine(*enc(same)) == pytest.approx(1.0, abs=1e-9)
        other = next(q for q in qs if q.ptype != t.name)
        assert cosine(*enc([same[0], other])) < 0.5


def _lev(a, b):
    if not a:
        return len(b)
    if not b:
        return len(a)
    return min(_lev(a[1:], b) + 1, _lev(a, b[1:]) + 1, _lev(a[1:], b[1:]) + (a[0] != b[0]))


def test_edit_distance_against_recursive_definition():
    r = np_rng(0, "test", "edit")
    for _ in range(200):
        a = tuple(r.choice(list("abc"), r.integers(0, 5)))
        b = tuple(r.choice(list("abc"), r.integers(0, 5)))
        assert edit_distance(a, b) == _lev(a, b)


def test_entropies_against_scipy(world):
    for m in (1, 2, 3, 7):
        assert structural_entropy({"a": [(i,) for i in range(m)] * 5}) == pytest.approx(math.log(m))
    seqs = [("x",)] * 3 + [("y",)] + [("z",)] * 4 + [("w",)] + [("v",)] * 5
    assert structural_entropy({"a": seqs}) == pytest.approx(sp_entropy([3, 1, 4, 1, 5]))
    qs, _, V = world
    b = build_bank(qs, V, ProgrammaticTeacher(), k_max=16, g=np_rng(0, "test", "bank"))["bank"]
    assert usage_entropy(b) == pytest.approx(sp_entropy(list(b.usages().values())))
    assert usage_entropy(PathBank(2, 3)) == 0.0
    assert structural_entropy({"a": [("x",), ("y",)], "b": [("z",)] * 3}) == pytest.approx(math.log(2) / 2)


def test_bank_invariants_after_every_prune(world, monkeypatch):
    qs, _, V = world
    sizes = []
    orig = PathBank.prune

    def spy(self):
        out = orig(self)
        sizes.append((len(self), self.k_max, sum(self.usages().values()), len(self.assigned)))
        return out
    monkeypatch.setattr(PathBank, "prune", spy)
    for k in (1, 3, 16):
        build_bank(qs, V, ProgrammaticTeacher(), k_max=k, merge_every=50, g=np_rng(0, "test", "bank"))
    assert sizes and all(n <= k and u == a for n, k, u, a in sizes)


def test_merge_keeps_coverage(world):
    qs, _, V = world
    T = ProgrammaticTeacher()
    res = build_bank(qs, V, T, k_max=64, delta_new=0.95, g=np_rng(0, "test", "bank"))   # a loose bank with near-duplicate paths
    b = res["bank"]
    before = coverage_on(b, qs, V)
    n0 = len(b)
    b.merge(0.5)
    assert len(b) <= n0 and coverage_on(b, qs, V) >= before - 0.01
    assert sum(b.usages().values()) == len(b.assigned)


def test_bank_recovers_types_and_forced_sharing(world):
    qs, _, V = world
    res = build_bank(qs, V, ProgrammaticTeacher(), k_max=16, g=np_rng(0, "test", "bank"))
    assert len(PROBLEM_TYPES) <= len(res["bank"]) <= 2 * len(PROBLEM_TYPES) and res["coverage"] >= 0.95
    assert supervision_entropy(res["supervision"]) <= 0.15
    small = build_bank(qs, V, ProgrammaticTeacher(), k_max=3, g=np_rng(0, "test", "bank"))
    assert len(small["bank"]) <= 3 and small["coverage"] <= 3 / len(PROBLEM_TYPES) + 0.05


def test_real_abstraction_on_hand_written_rationales():
    cases = {
        "change": ("1. Multiply 4 by 6: 4 * 6 = 24\n2. Subtract from the bill: 50 - 24 = 26\nAnswer: 26", (4, 6, 50),
                   ("MUL(q1,q2)", "SUB(q3,r1)")),
        "distance": ("**Step 1:** 7 x 6 = 42 miles. Answer: 42", (7, 6), ("MUL(q1,q2)",)),
        "leftover": ("Step 1) 3 times 5 is 15.\nStep 2) 40 minus 15 is 25\nAnswer: 25", (40, 3, 5), ("MUL(q2,q3)", "SUB(q1,r1)")),
        "discount": ("30 × 20 = 600, then 600 ÷ 100 = 6, and 30 − 6 = 24. Answer: 24", (30, 20),
                     ("MUL(q1,q2)", "DIV(r1,100)", "SUB(q1,r2)")),
        "wage": ("5*4=20; 20+7=27; 27-9=18. Answer: 18", (5, 4, 7, 9), ("MUL(q1,q2)", "ADD(r1,q3)", "SUB(r2,q4)")),
        "age": ("- 8 + 3 = 11\n- 11 + 6 = 17\nAnswer: 17", (8, 3, 6), ("ADD(q1,q2)", "ADD(r1,q3)")),
        "minutes": ("1. 2 hours * 60 = 120 minutes\n2. 120 + 25 = 145\nAnswer: 145", (2, 25), ("MUL(q1,60)", "ADD(r1,q2)")),
        "compare": ("First 9 plus 4 equals 13. Then 30 - 13 = 17. Answer: 17", (30, 9, 4), ("ADD(q2,q3)", "SUB(q1,r1)")),
    }
    assert set(cases) == {t.name for t in PROBLEM_TYPES}
    for name, (text, qs, path) in cases.items():
        assert abstract_text(text, qs) == path, name
        assert path in valid_paths(name)
        assert parse_answer_text(text) == float(text.rsplit(":", 1)[1])


def test_answer_parsers_robust_to_trailing_tokens():
    assert parse_student_answer("plan : x . answer : 4 2 <eos> answer : 9".split()[:8]) == 42
    assert parse_student_answer("answer : 1 3 2 . we go on".split()) == 132
    assert parse_student_answer("no answer here".split()) is None
    assert parse_answer_text("So 3 * 4 = 12.\nAnswer: 12 apples. Thanks!") == 12.0


def test_student_generation_stops_at_eos(world):
    qs, _, _ = world
    tok = student_tokenizer([prompt_text(q) for q in qs[:20]] + ["answer : plan ."])
    h = tinygpt_handle(tok, d_model=16, n_layers=1, n_heads=2, max_len=96)
    with torch.no_grad():
        h.model.tok_emb.weight[tok.eos_id] *= 50   # make EOS the likely next token
    outs = student_answers(h, qs[:8], calculator=False)
    assert all("<eos>" not in o["text"].split() for o in outs)
    assert all(o["n_tokens"] < 96 for o in outs)


def test_calculator_forces_the_result_digits():
    tok = student_tokenizer(["we multiply 1 2 * 6 0 = . answer :"])
    calc = Calculator(tok, 1)
    ids = torch.tensor([[tok.stoi[w] for w in "we multiply 1 2 * 6 0 =".split()]])
    logits = torch.zeros(1, tok.vocab_size)
    got = []
    for step in range(3):
        lg = calc(step, ids, logits.clone())
        nxt = int(lg.argmax(-1))
        got.append(tok.itos[nxt])
        ids = torch.cat([ids, torch.tensor([[nxt]])], 1)
    assert got == spell("720").split()


def test_top_p_filter_matches_manual_nucleus():
    lg = torch.tensor([[2.0, 1.0, 0.5, -1.0, -3.0]])
    p = torch.softmax(lg / 0.7, -1)[0]
    out = top_p_filter(0.9, 0.7)(0, None, lg.clone())[0]
    keep, acc = [], 0.0
    for i in torch.argsort(p, descending=True).tolist():
        keep.append(i)
        acc += float(p[i])
        if acc >= 0.9:
            break
    assert sorted(torch.isfinite(out).nonzero().flatten().tolist()) == sorted(keep)


def test_bound_monotone_pieces(world):
    sq = [bound_terms(0.0, 0.1, k, 12.0, math.log(k), 1000)["complexity"] for k in (1, 2, 4, 8, 16, 64)]
    assert all(a < b for a, b in zip(sq, sq[1:]))
    n, delta = 1000, 0.05
    assert bound_terms(0.2, 0.1, 4, 12.0, 1.0, n, 1.0, delta)["complexity"] == pytest.approx(
        math.sqrt((4 * 12.0 + 1.0 + math.log(2 * math.sqrt(n) / delta)) / (2 * n)))
    qs, _, V = world
    gaps = [1 - build_bank(qs, V, ProgrammaticTeacher(), k_max=k, g=np_rng(0, "test", "bank"))["coverage"] for k in (1, 2, 4, 8, 16)]
    assert all(a >= b - 1e-12 for a, b in zip(gaps, gaps[1:])) and gaps[-1] <= 0.05


def test_bad_input_is_rejected_before_work(world):
    qs, _, V = world
    with pytest.raises(ParameterError, match="empty"):
        build_bank([], np.zeros((0, 3)), ProgrammaticTeacher(), k_max=4, g=np_rng(0, "test", "bank"))
    with pytest.raises(ParameterError, match="k_max"):
        PathBank(0, 3)
    with pytest.raises(ParameterError, match="k_max"):
        resolve(PRESETS, "smoke", k_max=0)
    res = build_bank(qs[:50], V[:50], ProgrammaticTeacher(), k_max=4, g=np_rng(0, "test", "bank"))
    with pytest.raises(ParameterError, match="does not exist"):
        res["bank"].path(10**6)
    with pytest.raises(ParameterError, match="problem type"):
        make_questions(3, types=("nope",), g=np_rng(0, "test", "questions"))
    with pytest.raises(ParameterError, match="empty"):
        QuestionEncoder([])
    with pytest.raises(ParameterError, match="arms"):
        resolve(PRESETS, "smoke", arms=("freeform",))
