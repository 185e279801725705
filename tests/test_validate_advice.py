"""`validate` warns about a policy that is valid but does less than a person expects."""

import json


def _checks(repo):
    result = repo.cli("validate", "--json")
    assert result.exit_code == 0, result.output  # a warning is never an error
    report = json.loads(result.output)
    assert report["ok"] is True
    return report["checks"]


def test_validate_warns_when_no_verify_command_checks_the_work(make_repo):
    from support import StoryDef

    repo = make_repo([StoryDef("1-1-alpha", files=["src/alpha.py"])])
    warnings = [c for c in _checks(repo) if c["name"] == "verify"]
    assert [c["status"] for c in warnings] == ["warn"]
    assert "[verify] commands is empty" in warnings[0]["detail"]
    assert "policy.toml" in warnings[0]["detail"]
    text = repo.cli("validate").output
    assert "warn verify: " in text and "[verify] commands is empty" in text

    repo.write_policy('[verify]\ncommands = ["python -m pytest -q"]\n')
    assert [c for c in _checks(repo) if c["name"] == "verify"] == []
