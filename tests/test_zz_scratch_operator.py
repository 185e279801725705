import json, shutil
from conftest import StoryDef

def test_scratch(make_repo):
    stories = [StoryDef("1-1-alpha", files=["src/alpha.py"]), StoryDef("1-2-beta", files=["src/beta.py"]),
               StoryDef("1-3-gamma", files=["src/alpha.py"])]
    script = {"1-1-alpha": {"dev": [{"write": {"src/alpha.py": "A\n"}, "say": "hello alpha"}]},
              "1-2-beta": {"dev": [{"write": {"src/beta.py": "bad\n"}}]},
              "1-3-gamma": {"dev": [{"write": {"src/alpha.py": "G\n"}}]}}
    repo = make_repo(stories, script=script, policy='[scm]\nmax_parallel = 2\n[gates]\nmode = "none"\n[verify]\ncommands = ["! grep -q bad src/beta.py"]\n')
    r = repo.cli("run")
    for args in [("history",), ("history", "--json"), ("sql", "select story, state, work_s from v_story_runs"), ("sql", "delete from runs"), ("sql", "select * from v_escalations", "--json"),
                 ("journal", "--kind", "story.escalated"), ("journal", "--follow", "--story", "1-1-alpha"), ("attach", "--no-follow"), ("attach", "--no-follow", "1-1"), ("attach", "1-2"), ("status", "--watch")]:
        res = repo.cli(*args)
        print("$", args, res.exit_code); print(res.output)
