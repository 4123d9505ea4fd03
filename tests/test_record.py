import json

import pytest

from genlab.record import ClaimFailed, Claims, record, to_jsonable


def test_claims_sanity_raises_paper_claims_do_not(capsys):
    c = Claims()
    assert c.check("ok", True, sanity=True, a=1) is True
    assert c.check("paper", False, measured=0.3) is False
    with pytest.raises(ClaimFailed, match="broken"):
        c.check("broken", False, sanity=True, err=2.0)
    assert [i["name"] for i in c.items] == ["ok", "paper", "broken"]
    assert "| paper | paper | **false** | measured = 0.3 |" in c.table()


def test_record_returns_value_and_jsonable():
    assert record("x", 3) == 3
    assert json.dumps(to_jsonable({"a": float("inf"), "b": [1.5]})) == '{"a": "inf", "b": [1.5]}'
