"""`attach RUN STORY --all`: every session and verify log of a story, in order, each under a
header naming the phase, the attempt and when it started."""

import re

from support import StoryDef

ALPHA = StoryDef("1-1-alpha", files=["src/alpha.py"])
# dev 1 fails verify; dev 2 passes; review 1 asks for changes; fix 1; review 2 approves.
SCRIPT = {"1-1-alpha": {
    "dev": [{"write": {"src/alpha.py": "bad\n"}, "say": "DEV ONE"},
            {"write": {"src/alpha.py": "A = 2\n"}, "say": "DEV TWO"}],
    "review": [{"exit": 1, "say": "REVIEW ONE wants a docstring"}, {"say": "REVIEW TWO approves"}],
    "fix": [{"write": {"src/alpha.py": '"""Alpha."""\nA = 2\n'}, "say": "FIX ONE"}],
}}
POLICY = '[verify]\ncommands = ["echo VERIFY RAN; ! grep -q bad src/alpha.py"]\n'
HEADER = re.compile(r"^==> (.+?) attempt (.+?), started (\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ): (\S+) <==$",
                    re.M)


def test_attach_all_prints_the_storys_whole_history_in_order(make_repo, escalate_at_once):
    repo = make_repo([ALPHA], script=SCRIPT, policy=POLICY)
    assert repo.cli("run").exit_code == 0
    run_id = repo.status()["run"]["id"]
    result = repo.cli("attach", run_id, "1-1-alpha", "--all")
    assert result.exit_code == 0, result.output
    out = result.output
    headers = HEADER.findall(out)
    assert [(phase, attempt) for phase, attempt, _, _ in headers] == [
        ("dev", "1"), ("verify", "dev 1, review 0"), ("dev", "2"), ("verify", "dev 2, review 0"),
        ("review", "1"), ("fix", "1"), ("verify", "dev 2, review 1"), ("review", "2"),
        ("candidate verify", "1"),
    ]
    starts = [start for _, _, start, _ in headers]
    assert starts == sorted(starts)
    assert [path.rsplit("/", 1)[1] for _, _, _, path in headers] == [
        "dev-1.log", "verify-1-0.log", "dev-2.log", "verify-2-0.log", "review-1.log", "fix-1.log",
        "verify-2-1.log", "review-2.log", "verify-candidate-1.log"]
    # Each log's own text sits under its header, whole.
    sections = HEADER.split(out)[5::5]
    said = ["DEV ONE", "VERIFY RAN", "DEV TWO", "VERIFY RAN", "REVIEW ONE wants a docstring",
            "FIX ONE", "VERIFY RAN", "REVIEW TWO approves", "VERIFY RAN"]
    for text, words in zip(sections, said, strict=True):
        assert words in text and "=== bmad-loop " in text and " started " in text
    assert "exited 1" in sections[1] and "exited 0" in sections[3]


def test_attach_all_on_a_story_without_logs_says_so(make_repo):
    repo = make_repo([ALPHA, StoryDef("1-2-beta", files=["src/alpha.py"])],
                     script={"1-1-alpha": {"dev": [{"exit": 1}]}},
                     policy="[limits]\nmax_dev_attempts = 1\n")
    assert repo.cli("run").exit_code == 3  # alpha escalates; beta (same file) never starts
    result = repo.cli("attach", "1-2-beta", "--all")
    assert result.exit_code == 0, result.output
    assert result.output.strip() == "1-2-beta: no session or verify log yet"
    result = repo.cli("attach", "1-1-alpha", "--all")
    assert [h[:2] for h in HEADER.findall(result.output)] == [("dev", "1")]
