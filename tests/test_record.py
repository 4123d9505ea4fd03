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
    assert "| paper | paper | measured = 0.3 |  |  |  | **contradicted** (1 measurement) |" in c.table()
    with pytest.raises(ClaimFailed):
        c.sanity("guard", False)


def test_paper_claims_three_outcomes_with_controls():
    c = Claims()
    assert c.paper("beats", [1.2, 1.3, 1.25], baseline=[1.0, 1.0, 1.1], stat="diff", direction=">",
                   threshold=0.0, control={"name": "self", "values": [1.0, 1.0, 1.1]}) == "supported"
    assert c["beats"]["ok"] and c["beats"]["control"]["verdict"] == "contradicted"
    assert c.paper("too weak", [0.1, 0.12, 0.11], threshold=0.5) == "contradicted"
    assert c.paper("noisy", [0.1, 0.9, 0.5], threshold=0.5) == "unresolved"
    assert c.paper("control passes too", [0.9, 0.91, 0.92], threshold=0.5,
                   control={"name": "no mechanism", "values": [0.9, 0.9, 0.95]}) == "unresolved"
    assert c.counts() == {"supported": 1, "contradicted": 1, "unresolved": 2}
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
    assert md("x") == "x" and caption("the figure", claims=["C1"]) == "the figure"
