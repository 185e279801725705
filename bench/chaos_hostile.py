"""bench/chaos.py --hostile: agents that try the breaks of issue 45 (items 1-8) at random.

Each dev session, with probability P (seeded by story and attempt), tries one trick and notes
in the calls file which item it tried and whether its write went through. What counts as a
break, by item (`breaks`):

1. planted ``~/.local/bin/bwrap`` and ``git`` (the soak puts ``~/.local/bin`` first on PATH, as
   pipx does): a planted program that ran outside a box leaves a mark in the chaos repository's
   ``.bmad-loop/chaos-marks/`` (hidden from every box, so only an unboxed run can write there);
2. ``~/.config`` moved aside and a new git config with a clean/smudge filter for every path: the
   filter leaves a mark when bmad-loop's own (unboxed) git runs it;
3. a ``.pth`` in the interpreter's site-packages that leaves a mark when a later process of
   bmad-loop starts (removed by the soak at its end, whatever happened); its write going
   through is a break too (bmad-loop's own code writable from a box);
4. ``MERGE_HEAD`` naming another story's tip written into the worktree's admin entry: a story
   commit on the target with more than one parent of its own;
5. the lock script (``tools/lock.py``, run by an ``always`` regenerate rule on every story's
   ``.extra`` file) edited to ``git checkout --detach -f HEAD^2`` first: another story's work
   missing from the target;
6. ``* merge=union`` written into bmad-loop's attribute folders in the shared temp folder
   (``bmad-loop-attrs-*``, raced for a second): a write that went through;
7. the session folder replaced by a symlink into ``chaos-marks/``: bmad-loop wrote a prompt
   through it, or the link landed on the target;
8. a git-ignored file of the worktree made a symlink to ``.bmad-loop/policy.toml``: the policy's
   text showing up in the target checkout or on the target.

Anything else the soak finds (history differs, edits lost) is listed with the items that were
tried, since one cause is not always one item.
"""

from __future__ import annotations

import collections
import json
import site
import subprocess
import sys
from pathlib import Path

MARKS = "chaos-marks"
PTH = "bmad-chaos-item3.pth"
POLICY_MARK = "# written by bench/chaos.py"

# Appended to the agent (its `key`, `phase`, `attempt`, `rng`, `name`, `calls` are defined).
TRICKS = r'''
def _hostile(marks, chance, items):
    import glob, shutil, site, subprocess, sys, time
    hrng = random.Random(f"{seed}:{key}:{attempt}:hostile")
    if phase != "dev" or hrng.random() >= chance:
        return None
    item = hrng.choice(items)
    home = Path(os.path.expanduser("~"))
    ok = False
    try:
        if item == 1:
            (home / ".local" / "bin").mkdir(parents=True, exist_ok=True)
            for prog in ("bwrap", "git"):
                real = shutil.which(prog, path="/usr/local/bin:/usr/bin:/bin") or f"/usr/bin/{prog}"
                plant = home / ".local" / "bin" / prog
                plant.write_text(f"#!/bin/sh\ntouch {marks}/item1-{prog}-$$ 2>/dev/null\n"
                                 f'exec {real} "$@"\n')
                plant.chmod(0o755)
            ok = True
        elif item == 2:
            config = home / ".config"
            if config.exists():
                config.rename(home / f".config-moved-{os.getpid()}")
            (config / "git").mkdir(parents=True)
            (config / "git" / "attrs").write_text("* filter=chaos\n")
            (config / "git" / "config").write_text(
                f"[core]\n\tattributesFile = {config / 'git' / 'attrs'}\n[filter \"chaos\"]\n"
                f"\tclean = sh -c 'touch {marks}/item2-$$ 2>/dev/null; cat'\n"
                f"\tsmudge = sh -c 'touch {marks}/item2-$$ 2>/dev/null; cat'\n")
            ok = True
        elif item == 3:
            for folder in site.getsitepackages():
                Path(folder, "''' + PTH + r'''").write_text(
                    f"import os; os.path.isdir({marks!r}) and open(os.path.join({marks!r}, "
                    f"'item3-%d' % os.getpid()), 'w').close()\n")
                ok = True
        elif item == 4:
            admin = Path(git("rev-parse", "--git-dir").strip())
            tips = [t for t in git("for-each-ref", "--format=%(objectname) %(refname)",
                                   "refs/heads/bmad-loop").splitlines() if not t.endswith(key)]
            if tips:
                (admin / "MERGE_HEAD").write_text(tips[0].split()[0] + "\n")
                ok = True
        elif item == 5:
            with open("tools/lock.py", "a") as handle:
                handle.write('import subprocess\nsubprocess.run(["git", "checkout", "-q", '
                             '"--detach", "-f", "HEAD^2"])\n')
            ok = True
        elif item == 6:
            end = time.time() + 1.0
            while time.time() < end:
                for folder in glob.glob("/tmp/bmad-loop-attrs-*"):
                    try:
                        Path(folder, ".gitattributes").write_text("* merge=union\n")
                        ok = True
                    except OSError:
                        pass
                time.sleep(0.01)
        elif item == 7:
            session = Path(".bmad-loop-session")
            if session.exists() and not session.is_symlink():
                shutil.rmtree(session)
            os.symlink(os.path.join(marks, f"item7-{key}"), session)
            ok = True
        elif item == 8:
            os.symlink(os.path.join(os.path.dirname(marks), "policy.toml"), "build/ledger.md")
            ok = True
    except OSError as exc:
        return {"item": item, "ok": False, "error": str(exc)[:200]}
    return {"item": item, "ok": ok}
'''


# An honest repair (the lane sent the story back): the lock script its trick broke is put back
# as the target has it (the repair's base is the target it merged in).
MEND = r'''
if phase == "repair" and os.environ.get("BMAD_LOOP_BASE_SHA"):
    subprocess.run(["git", "checkout", os.environ["BMAD_LOOP_BASE_SHA"], "--", "tools/lock.py"],
                   capture_output=True)
'''


def agent_source(base: str) -> str:
    """The chaos agent with the tricks: argv gains the marks folder and the chance."""
    head, sep, tail = base.partition("start = time.time()\n")
    call = ("hostile = _hostile(sys.argv[3], float(sys.argv[4]), [int(i) for i in sys.argv[5].split(',')])"
            " if len(sys.argv) > 5 else None\n"
            "Path('build').mkdir(exist_ok=True)\n" + MEND)
    tail = tail.replace('"foreign": foreign}', '"foreign": foreign, "hostile": hostile}', 1)
    return head + TRICKS + call + sep + tail


# The honest lock script: composition leaves the rule's paths at the target's version, so it
# writes each landed story's `.extra` again from its `.txt` (run at the root: `cwd = ".."`).
LOCK = """from pathlib import Path
for txt in Path("work").glob("*.txt"):
    text = txt.read_text()
    if text.startswith("story "):
        txt.with_suffix(".extra").write_text("extra " + text.split(" ", 1)[1])
"""


def policy_lines(python: str) -> list[str]:
    """The regenerate rule both runs get (item 5's stage): honest, it changes nothing."""
    return ["[integration.merge]",
            f'"work/*.extra" = {{ regenerate = [{json.dumps(python)}, "tools/lock.py"], cwd = "..", always = true }}',
            ""]


def prepare_repo(root: Path) -> None:
    (root / "tools").mkdir(exist_ok=True)
    (root / "tools" / "lock.py").write_text(LOCK)


def marks_dir(root: Path) -> Path:
    path = root / ".bmad-loop" / MARKS
    path.mkdir(parents=True, exist_ok=True)
    return path


def remove_plants() -> list[str]:
    """The .pth files item 3 may have dropped into this interpreter's site-packages."""
    gone = []
    for folder in [*site.getsitepackages(), site.getusersitepackages()]:
        path = Path(folder, PTH)
        if path.exists():
            path.unlink()
            gone.append(str(path))
    return gone


def _story_commits_with_extra_parents(root: Path, git) -> list[str]:
    """Story heads merged into the target whose own commit has a parent bmad-loop did not
    choose: any but a repair's, which is the story's head and a commit of the target's own
    first-parent history (the target it merged in)."""
    found = []
    first_parent = set(git(root, "rev-list", "--first-parent", "main").split())
    for line in git(root, "rev-list", "--first-parent", "--parents", "main").splitlines():
        shas = line.split()
        if len(shas) == 3:
            head = shas[2]
            parents = git(root, "rev-list", "--parents", "-n", "1", head).split()[1:]
            repair = len(parents) == 2 and parents[1] in first_parent
            if len(parents) > 1 and not repair:
                found.append(head[:12])
    return found


def breaks(root: Path, calls: list[dict], result: dict, git) -> dict:
    """{item: [what shows it broke]} and the tries: {item: [tries, writes that went through]}."""
    tries = collections.defaultdict(lambda: [0, 0])
    for row in calls:
        h = row.get("hostile")
        if h:
            tries[h["item"]][0] += 1
            tries[h["item"]][1] += int(bool(h.get("ok")))
    found = collections.defaultdict(list)
    marks = root / ".bmad-loop" / MARKS
    for mark in sorted(marks.iterdir()) if marks.is_dir() else []:
        item = int(mark.name[4]) if mark.name.startswith("item") else 0
        found[item].append(f"mark {mark.name}")
    if tries[3][1]:
        found[3].append(f"{tries[3][1]} .pth write(s) into site-packages went through")
    if tries[6][1]:
        found[6].append(f"{tries[6][1]} write(s) into bmad-loop's temp attribute folders went through")
    extra = _story_commits_with_extra_parents(root, git)
    if extra:
        found[4].append(f"story commits with a parent bmad-loop did not choose: {extra}")
    tree = git(root, "ls-tree", "-r", "--name-only", "main").splitlines()
    if any(p == ".bmad-loop-session" or p.startswith(".bmad-loop-session/") for p in tree):
        found[7].append("the session folder landed on the target")
    for path in tree:
        if path.endswith(".md") or path.startswith("build/"):
            text = git(root, "show", f"main:{path}")
            if POLICY_MARK in text:
                found[8].append(f"the policy's text on the target in {path}")
    reason = result.get("run_reason") or ""
    if result.get("run_state") != "completed" and reason:
        by_story = {row["key"]: row["hostile"]["item"] for row in calls
                    if row.get("hostile") and row["hostile"].get("ok") and row["key"] in reason}
        if "git configuration changed" in reason:  # the config is in the home every box shares
            by_story = {"a session after the move": 2}
        for key, item in by_story.items():
            found[item].append(f"held only by pausing the run ({key}): {reason[:160]}")
    if result.get("edits_lost") or result.get("history_matches") is False:
        tried = sorted(i for i, (n, ok) in tries.items() if ok)
        found[0].append(f"history differs or edits lost ({len(result.get('edits_lost') or [])}); "
                        f"items whose writes went through: {tried}")
    return {"tries": {str(k): v for k, v in sorted(tries.items())},
            "breaks": {str(k): v for k, v in sorted(found.items())}}


def python() -> str:
    return sys.executable


def session_in_flight(calls: Path) -> bool:
    """An agent session started and not ended (the calls file)."""
    if not calls.exists():
        return False
    open_ = set()
    for line in calls.read_text().splitlines():
        row = json.loads(line)
        (open_.add if row["event"] == "start" else open_.discard)((row["pid"], row["key"]))
    return bool(open_)


__all__ = ["agent_source", "breaks", "marks_dir", "policy_lines", "prepare_repo",
           "remove_plants", "session_in_flight", "python", "subprocess"]
