import json, shutil
from conftest import StoryDef

def test_scratch(make_repo):
    stories = [StoryDef("1-1-alpha", files=["src/alpha.py"]), StoryDef("1-2-beta", files=["src/beta.py"]),
               StoryDef("1-3-gamma", files=["src/alpha.py"])]
    script = {"1-1-alpha": {"dev": [{"write": {"src/alpha.py": "A\n"}, "say": "hello alpha"}]},
              "1-2-beta": {"dev": [{"write": {"src/beta.py": "bad\n"}}]},
              "1-3-gamma": {"dev": [{"write": {"src/alpha.py": "G\n"}}]}}
    repo = make_repo(stories, script=script, policy='[scm]\nmax_parallel = 2\n[gates]\nmode = "none"\n[verify]\ncommands = ["! grep -q bad src/beta.py"]\n[parallel]\non_escalation = "continue"\n')
    r = repo.cli("run")
    print(r.output)
    import sqlite3; src = sqlite3.connect(repo.root / ".bmad-loop/state.db"); dst = sqlite3.connect("/tmp/optry/state.db"); src.backup(dst); dst.close()
    print(json.dumps(repo.status(), indent=1))
    for e in repo.journal(): print(json.dumps(e))
