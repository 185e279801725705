"""`bmad-loop history`: every run of the project with counts, durations and outcome."""

import json

from support import ALPHA_BETA as STORIES



def test_history_lists_runs_newest_first_with_counts_durations_and_outcome(make_repo):
    script = {"1-1-alpha": {"dev": [{"write": {"src/alpha.py": "A = 1\n"}}]},
              "1-2-beta": {"dev": [{"write": {"src/beta.py": "bad\n"}}]}}
    repo = make_repo(STORIES, script=script,
                     policy='[gates]\nmode = "none"\n[verify]\ncommands = ["! grep -q bad src/beta.py"]\n')
    assert repo.cli("run").exit_code == 3
    first = repo.status()["run"]["id"]
    repo.write_script({"1-2-beta": {"dev": [{"write": {"src/beta.py": "good\n"}}]}})
    assert repo.cli("resume", first).exit_code == 0  # beta gets a fresh budget and lands

    result = repo.cli("history", "--json")
    assert result.exit_code == 0, result.output
    (entry,) = json.loads(result.output)
    assert entry["id"] == first and entry["state"] == "completed"
    assert entry["outcome"] == "success" and entry["exit_code"] == 0
    assert entry["counts"] == {"integrated": 2} and entry["stories"] == 2
    assert entry["duration_s"] > 0 and entry["ended_at"] is not None

    text = repo.cli("history").output.splitlines()
    assert text[0].split() == ["RUN", "STATE", "OUTCOME", "DURATION", "STORIES", "TOKENS", "COST",
                               "COUNTS"]
    assert text[1].startswith(first) and "success" in text[1] and "2 integrated" in text[1]
    # a custom command reports no usage: nulls, shown as "-"
    assert entry["usage"] == {"input_tokens": None, "output_tokens": None, "cache_read_tokens": None,
                              "cache_write_tokens": None, "cost_usd": None}
    assert text[1].split()[5:7] == ["-", "-"]


def test_history_of_a_paused_run_says_it_needs_a_human_and_why(make_repo):
    script = {"1-1-alpha": {"dev": [{"write": {"src/alpha.py": "bad\n"}}]}}
    repo = make_repo(STORIES[:1], script=script,
                     policy='[verify]\ncommands = ["! grep -q bad src/alpha.py"]\n')
    assert repo.cli("run").exit_code == 3
    (entry,) = json.loads(repo.cli("history", "--json").output)
    assert entry["state"] == "paused" and entry["outcome"] == "needs a human"
    assert entry["exit_code"] == 3 and entry["counts"] == {"escalated": 1}
    text = repo.cli("history").output
    assert f"{entry['id']}: " in text and "escalated" in text


def test_history_without_runs_says_so(make_repo):
    repo = make_repo(STORIES[:1])
    result = repo.cli("history")
    assert result.exit_code == 0 and result.output.strip() == "no runs yet"
    assert json.loads(repo.cli("history", "--json").output) == []
