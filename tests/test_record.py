import json

import pytest

from genlab.record import ClaimFailed, Claims, caption, esc, fmt, md, record, to_jsonable


def test_claims_sanity_raises_paper_claims_do_not(capsys):
    c = Claims()
    assert c.check("ok", True, sanity=True, a=1) is True
    assert c.check("paper", False, measured=0.3) is False
    with pytest.raises(ClaimFailed, match="broken"):
        c.check("broken", False, sanity=True, err=2.0)
    assert [i["name"] for i in c.items] == ["ok", "paper", "broken"]
    assert "| paper | paper | measured = 0.3 |  |  |  |  | **contradicted** (1 measurement) |" in c.table()
    with pytest.raises(ClaimFailed):
        c.sanity("guard", False)


def test_paper_claims_three_outcomes_with_controls():
    c = Claims()
    assert c.paper("beats", [1.2, 1.3, 1.25], baseline=[1.0, 1.0, 1.1], stat="diff", direction=">",
                   threshold=0.0, control={"name": "ablated", "values": [0.9, 0.88, 0.98]}) == "supported"
    assert c["beats"]["ok"] and c["beats"]["control"]["verdict"] == "contradicted"
    weak = {"name": "no mechanism", "values": [0.1, 0.11, 0.1]}
    assert c.paper("too weak", [0.1, 0.12, 0.11], threshold=0.5, control=weak) == "contradicted"
    assert c.paper("noisy", [0.1, 0.9, 0.5], threshold=0.5, control=weak) == "unresolved"
    assert c["noisy"]["reason"].startswith("needs ≈ ") or c["noisy"]["reason"] == "at threshold"
    assert c.paper("control passes too", [0.9, 0.91, 0.92], threshold=0.5,
                   control={"name": "no mechanism", "values": [0.9, 0.9, 0.95]}) == "unresolved"
    assert c["control passes too"]["reason"] == "control also passes"
    assert c.paper("no control", [0.9, 0.91, 0.92], threshold=0.5) == "unresolved"
    assert c.counts() == {"supported": 1, "contradicted": 1, "unresolved": 3,
                          "reasons": {"at threshold": 1, "control also passes": 1, "control undecided": 1}}  # noisy: mean on the threshold
    assert "supported: difference" in c.text("beats")
    c.calibration("rate", False, rate=0.3)
    assert c.counts()["supported"] == 1 and c["rate"]["kind"] == "calibration"
    with pytest.raises(ValueError, match="seeds"):
        c.paper("bad", [1.0, 2.0], threshold=0, seeds=[0])
    assert "| noisy | paper |" in c.table()


def test_record_returns_value_and_jsonable():
    assert record("x", 3) == 3
    assert json.dumps(to_jsonable({"a": float("inf"), "b": [1.5]})) == '{"a": "inf", "b": [1.5]}'


def test_prose_helpers():
    assert fmt(0.000123456) == "0.000123" and fmt(12345.6) == "12346" and fmt(2) == "2"
    assert esc("a|b\nc") == "a\\|b c"
    assert md("x") is None and caption("the figure", claims=["C1"]) is None   # displayed once, no Out[] echo


def test_paper_refuses_controls_that_cannot_fail_and_deterministic_claims():
    from genlab.stats import ClaimRefused
    c = Claims()
    with pytest.raises(ClaimRefused, match="'same'.*same run"):
        c.paper("same", [1.2, 1.3, 1.25], threshold=1.0, direction=">",
                control={"name": "treatment again", "values": [1.2, 1.3, 1.25]})
    with pytest.raises(ClaimRefused, match="'b-b'.*itself"):
        c.paper("b-b", [1.2, 1.3, 1.4], baseline=[1.0, 1.1, 1.2], stat="diff", threshold=0.1, direction=">",
                control={"name": "baseline vs itself", "values": [1.0, 1.1, 1.2]})
    with pytest.raises(ClaimRefused, match="'const'.*constant"):
        c.paper("const", [1.2, 1.3, 1.4], threshold=1.0, direction=">", control={"name": "zero", "values": [0.0, 0.0, 0.0]})
    # with two seeds (a smoke run) equal counts can be chance: recorded, control marked refused, claim unresolved
    assert c.paper("two seeds", [0.0, 0.0], threshold=1.0, direction="<", control={"name": "k0", "values": [0.0, 0.0]}) \
        == "unresolved"
    assert c["two seeds"]["control"]["verdict"] == "refused" and c["two seeds"]["reason"] == "control undecided"
    assert c.paper("rank", [6.0, 6.0, 6.0], threshold=5.0, direction=">",
                   control={"name": "c", "values": [4.0, 3.9, 4.1]}) == "unresolved"
    assert c["rank"]["kind"] == "deterministic" and "rank" not in [i["name"] for i in c.items if i["kind"] == "paper"]
    assert c.paper("rank", [6.0, 6.0, 6.0], threshold=5.0, direction=">", exact="an integer rank: the same on every seed",
                   control={"name": "c", "values": [4.0, 3.9, 4.1]}) == "supported"
    assert not [i for i in c.items if i["name"] in ("same", "b-b", "const")]   # nothing recorded for a refused claim


def test_health_checks_gate_the_claims_that_name_them(monkeypatch):
    c = Claims(headline="C1")
    assert c.health("tokenizer IoU", [0.9, 0.88, 0.91], target=0.85) is True
    assert c.health("simulator beats ballistic", 0.134, target=0.107, direction="<") is False
    ctrl = {"name": "shuffled", "values": [0.1, 0.05, 0.12]}
    assert c.paper("C1 headline", [0.9, 0.95, 0.92], threshold=0.5, direction=">", requires="tokenizer IoU",
                   control=ctrl) == "supported"
    for vals in ([0.9, 0.95, 0.92], [0.1, 0.12, 0.11]):                      # both directions are held back
        v = c.paper("C2 rests on the simulator", vals, threshold=0.5, direction=">",
                    requires=["tokenizer IoU", "simulator beats ballistic"], control=ctrl)
        item = c["C2 rests on the simulator"]
        assert v == "unresolved" and item["reason"] == "precondition unmet: simulator beats ballistic (0.134 vs < 0.107)"
        assert item["measured"] in ("supported", "contradicted")
    with pytest.raises(ValueError, match="not a recorded check"):
        c.paper("C3", [1.0, 1.1, 1.2], threshold=0.5, direction=">", requires="never recorded")
    assert c["C1 headline"]["headline"] and not c["C2 rests on the simulator"]["headline"]
    c.summary()
    import genlab.record as rec
    shown = []
    monkeypatch.setattr(rec, "md", lambda text: shown.append(text))   # whatever the display (kernel or not)
    Claims(headline="C9").summary()                       # a section without its headline says so, and runs on
    assert any("C9' was not recorded" in t for t in shown)


def test_a_false_sanity_check_names_its_rule_and_numbers():
    with pytest.raises(ClaimFailed, match=r"fell to 0.81x its start; this check needs < 0.8x.*first = 25.6"):
        Claims().sanity("training reduces the loss", False, rule="the loss fell to 0.81x its start; this check needs < 0.8x",
                        first=25.6, last=20.7)
