#!/usr/bin/env python
"""Chaos soak: a sprint run by real consumer processes while random ones are killed with SIGKILL.

    python bench/chaos.py [--stories 30] [--seed 1] [--parallel 3] [--min-kill-s 3]
                          [--max-kill-s 8] [--story-consumers 1] [--deadline-s 900]
                          [--quick] [--dir DIR] [--keep] [--no-reference] [--json]
                          [--freeze-s F] [--status-loops N] [--stale-locks P] [--hostile P]

What it does:

1. Builds two identical BMAD-shaped repositories (a reference and a chaos one): K stories in
   epics of 10, each with a disjoint footprint (its own file under ``work/``), strategy
   ``merge``, ``max_parallel = N`` (so the lane verifies a stack of up to N candidates at once,
   and a landed story's worktree is reused by the next), ``[leases] ttl_s = 3``, gates
   ``none``, review on. The agent is a tiny script that sleeps a duration drawn from ``--seed``
   and the story key (0.5–2 s for dev, 0.05–0.2 s for review), then writes its files with
   content that depends on the key only, as a hostile agent would: its tracked file's edit
   hidden behind ``update-index --skip-worktree`` or ``--assume-unchanged``, its new file marked
   intent-to-add (``add -N``), ignored build output left behind; it notes any flag or build
   file of another story it finds in its worktree. The verify command keeps a stamp in ignored
   build output and fails when it finds one already (0.3 s): it passes only in a tree that is
   exactly a candidate's, or exactly the agent's output, so a repeated verification that sees
   what a killed one left fails the run.
2. Reference: enqueues the sprint and runs it with consumer subprocesses
   (``bmad-loop worker --queue stories -w N`` × S and ``bmad-loop worker --queue integration``),
   untouched, to completion.
3. Chaos: the same sprint, the same consumers, and every ``uniform(min, max)`` seconds (seeded)
   one consumer chosen at random is killed with SIGKILL and started again at once, until the run
   settles or the deadline passes. The agent sessions a dead story consumer leaves behind are not
   touched: finding and ending them is the engine's job.
4. Prints: kills survived per consumer kind, stories integrated, duplicates (stories with more
   than one ``story.integrated`` or ``target.advanced`` event: must be 0), whether the target's
   first-parent sequence of trees equals the reference's, agent edits missing from the target
   (each story's two files as its agent wrote them) and another story's leftovers seen by an
   agent (both must be 0) (tree SHAs are content-only, so they are
   comparable across repositories; commit SHAs are not), what ``bmad-loop cleanup --json``
   removed and whether any worktree or ref of bmad-loop's namespaces remains after it, leftover
   agent processes, two agent sessions of one story alive at once, attempt rows still ``running``
   after the run, stories whose counted dev attempts are not 1 (this agent never fails), the
   recovery on record (journal), where each kill landed (the last journal event before it), and
   wall times.

``--freeze-s F`` (off by default) turns half the faults into SIGSTOP for F seconds, then SIGCONT:
a stalled consumer whose pid stays alive, so its leases expire (after ``ttl_s``) instead of being
seen dead at once. That exercises the lease-expiry and fencing paths a SIGKILL on one host never
reaches.

``--status-loops N`` [2] runs N threads of plain ``git status`` in the chaos repository's target
checkout for the whole run (what an editor does: it takes ``index.lock`` for a moment), and
``--stale-locks P`` [0.3] makes each fault, with probability P, also leave a stale
``index.lock`` in that checkout as a killed bmad-loop lane would (the bmad-loop marker and a pid
that is dead): the lane must recognise it as its own and remove it. Both count towards the
verdict through the run's end state: a run that fails or pauses is a failed check.

``--hostile P`` (off by default) makes each dev session of the chaos run try, with probability
P, one of the breaks of issue 45 (items 1-8: planted programs on PATH, a moved ``~/.config``, a
``.pth`` in site-packages, ``MERGE_HEAD`` in the admin entry, an edited lock script, planted
merge attributes in the shared temp folder, the session folder or a git-ignored file made a
symlink), with the consumers on a HOME of their own; half the kills then wait for an agent
session and hit the consumer running it. Every break found is reported by its item number
(``bench/chaos_hostile.py`` says what counts as one) and fails the verdict. The dev sessions
append to their ``.extra`` file, so a session re-run on a killed one's leftovers doubles it.

The kill schedule is seeded; process timing is not, so two soaks with one seed kill at the same
moments but not necessarily at the same steps. Each kill is logged with what was in flight
(``--json`` prints everything). Not a test: nothing is asserted; the exit code is 0 when every
check holds, 1 otherwise.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import random
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import chaos_hostile as hostile_mod

BOARD_DIR = Path("_bmad-output") / "implementation-artifacts"
IDENTITY = ["-c", "user.name=chaos", "-c", "user.email=chaos@localhost", "-c", "commit.gpgsign=false"]
NAMESPACES = ("refs/heads/bmad-loop", "refs/bmad-loop")
VERIFY_FILE = "verify.py"
SETTLED = ("completed", "failed", "paused", "stopped")

AGENT = r'''"""bench/chaos.py agent: sleep a seeded duration, then write the story's files as a
hostile agent would: its tracked file's edit hidden behind an index flag, its new file marked
intent-to-add, ignored build output left behind. It notes what it found of other stories."""
import json, os, random, subprocess, sys, time
from pathlib import Path

seed, calls = sys.argv[1], sys.argv[2]
key, phase = os.environ["BMAD_LOOP_STORY_KEY"], os.environ["BMAD_LOOP_PHASE"]
attempt = os.environ.get("BMAD_LOOP_ATTEMPT")
rng = random.Random(f"{seed}:{key}:{phase}")
low, high = (0.5, 2.0) if phase in ("dev", "fix") else (0.05, 0.2)
duration = rng.uniform(low, high)
name = key.split("-", 2)[-1]
mine = {f"work/{name}.txt", f"work/{name}.extra"}


def git(*args):
    return subprocess.run(["git", *args], capture_output=True, text=True, check=True).stdout


# What another story left in this worktree (a reused one must look new): flags, build output.
# Dev is the story's first session here (review comes after its own verify's stamp).
foreign = []
if phase == "dev":
    flags = [line[2:] for line in git("ls-files", "-v").splitlines() if not line.startswith("H ")]
    foreign = [p for p in flags if p not in mine] + [
        f"build/{p.name}" for p in sorted(Path("build").glob("*")) if p.name != f"{key}.o"]
start = time.time()
with open(calls, "a") as handle:
    handle.write(json.dumps({"key": key, "phase": phase, "attempt": attempt, "pid": os.getpid(),
                             "event": "start", "t": start, "foreign": foreign}) + "\n")
time.sleep(duration)
if phase in ("dev", "fix"):
    Path(f"work/{name}.txt").write_text(f"story {key}\n")
    with open(f"work/{name}.extra", "a") as extra:  # appends: a re-run on leftovers doubles it
        extra.write(f"extra {key}\n")
    git("update-index", rng.choice(["--skip-worktree", "--assume-unchanged"]), f"work/{name}.txt")
    git("add", "-N", f"work/{name}.extra")
    Path("build").mkdir(exist_ok=True)
    Path(f"build/{key}.o").write_text("object code\n")
with open(calls, "a") as handle:
    handle.write(json.dumps({"key": key, "phase": phase, "attempt": attempt, "pid": os.getpid(),
                             "event": "end", "t": time.time()}) + "\n")
print(f"{phase} {key}: slept {duration:.2f}s")
'''

# The verify command: it keeps a stamp in ignored build output, as a build tool keeps a cache,
# and fails when it finds one already. So it passes in a tree that is exactly what it should be
# (a candidate's, or the agent's output), and fails where a killed verify's leftovers were kept.
VERIFY = r'''"""bench/chaos.py verify: fail on a stamp another verify left, else leave one."""
import os, sys, time
from pathlib import Path

stamp = Path("build") / "verify.stamp"
if stamp.exists():
    print(f"verify: {stamp} is here already (pid {stamp.read_text()}): not a clean tree")
    sys.exit(1)
stamp.parent.mkdir(exist_ok=True)
stamp.write_text(str(os.getpid()))
time.sleep(float(sys.argv[1]))
sys.exit(0 if Path("README.md").exists() else 1)
'''


# ------------------------------------------------------------------------------ the repository
def git(cwd: Path, *args: str) -> str:
    proc = subprocess.run(["git", *IDENTITY, *args], cwd=cwd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"git {' '.join(args)} failed in {cwd}: {proc.stderr.strip()}")
    return proc.stdout.strip()


def story_keys(count: int) -> list[str]:
    return [f"{i // 10 + 1}-{i % 10 + 1}-s{i + 1:02d}" for i in range(count)]


def build_repo(root: Path, keys: list[str], *, parallel: int, agent: Path, seed: int,
               calls: Path, hostile: float | None = None, items: str = "1,2,3,4,5,6,7,8") -> None:
    """`hostile` (--hostile): both runs get the regenerate rule item 5 needs; a chance > 0 makes
    this repository's agents try the tricks (chaos_hostile.py)."""
    root.mkdir(parents=True)
    git(root, "init", "-q", "-b", "main")
    (root / "README.md").write_text("# chaos soak repository\n")
    (root / ".gitignore").write_text(".bmad-loop/\n__pycache__/\nbuild/\n")
    (root / "work").mkdir()
    (root / "work" / "README.md").write_text("files the chaos agents write\n")
    for key in keys:  # tracked before the run: each agent's edit of it is hidden from git
        (root / "work" / f"{key.split('-', 2)[-1]}.txt").write_text("placeholder\n")
    artifacts = root / BOARD_DIR
    artifacts.mkdir(parents=True)
    board = ["# sprint board written by bench/chaos.py", "development_status:"]
    epics: dict[int, list[str]] = collections.defaultdict(list)
    for key in keys:
        epics[int(key.split("-")[0])].append(key)
    for epic, members in epics.items():
        board.append(f"  epic-{epic}: in-progress")
        for key in members:
            board.append(f"  {key}: ready-for-dev")
            name = key.split("-", 2)[-1]
            front = {"title": name, "footprint": {"files": [f"work/{name}.txt",
                                                            f"work/{name}.extra"]}}
            (artifacts / f"{key}.md").write_text(
                "---\n" + json.dumps(front, indent=2) + "\n---\n"
                f"# Story {key}\n\nStatus: ready-for-dev\n")
        board.append(f"  epic-{epic}-retrospective: optional")
    (artifacts / "sprint-status.yaml").write_text("\n".join(board) + "\n")
    state = root / ".bmad-loop"
    state.mkdir()
    argv = [sys.executable, str(agent), str(seed), str(calls)]
    if hostile is not None:
        hostile_mod.prepare_repo(root)
        if hostile > 0:
            argv += [str(hostile_mod.marks_dir(root)), str(hostile), items]
    (state / "policy.toml").write_text("\n".join([
        "# written by bench/chaos.py",
        "[scm]",
        f"max_parallel = {parallel}",
        'merge_strategy = "merge"',
        "",
        "[gates]",
        'mode = "none"',
        "",
        "[leases]",
        "ttl_s = 3",
        "",
        "[limits]",
        "max_recoveries = 1000  # the soak kills consumers on purpose: a story may be hit often",
        "",
        "[verify]",
        f"commands = [{json.dumps(f'{sys.executable} {agent.parent / VERIFY_FILE} 0.3')}]",
        "timeout_s = 120",
        "",
        "[adapter]",
        f"command = {json.dumps(argv)}",
        "timeout_s = 120",
        "",
        *(hostile_mod.policy_lines(sys.executable) if hostile is not None else []),
    ]))
    git(root, "add", "-A")
    git(root, "commit", "-q", "-m", "chaos: initial commit")


# ------------------------------------------------------------------------------ the CLI and the rows
def cli(root: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, "-m", "bmad_loop", *args, "--project", str(root)],
                          capture_output=True, text=True, env=child_env())
    if check and proc.returncode != 0:
        raise RuntimeError(f"bmad-loop {' '.join(args)} -> {proc.returncode}\n{proc.stdout}{proc.stderr}")
    return proc


HOSTILE_HOME: list[Path] = []  # --hostile: the consumers' own HOME (~/.local/bin first on PATH)


def child_env() -> dict:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("GIT_") and not k.startswith("BMAD_LOOP_")}
    if HOSTILE_HOME:
        home = HOSTILE_HOME[0]
        env.pop("XDG_CONFIG_HOME", None)
        env.update(HOME=str(home), PATH=f"{home / '.local' / 'bin'}:{env.get('PATH', '')}")
    return env


def db_rows(root: Path, sql: str, args=()) -> list[tuple]:
    path = root / ".bmad-loop" / "state.db"
    if not path.exists():
        return []
    for _ in range(50):
        try:
            with sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=30) as conn:
                return conn.execute(sql, args).fetchall()
        except sqlite3.OperationalError:
            time.sleep(0.1)
    return []


def run_state(root: Path, run_id: str) -> str | None:
    rows = db_rows(root, "SELECT state FROM runs WHERE id = ?", (run_id,))
    return rows[0][0] if rows else None


def in_flight(root: Path, run_id: str) -> dict:
    """What the run was doing at a kill: stories by state/phase, open candidates."""
    stories = collections.Counter(
        f"{state}:{phase}" if state == "working" else state
        for state, phase in db_rows(root, "SELECT state, phase FROM stories WHERE run_id = ?", (run_id,)))
    cands = collections.Counter(
        state for (state,) in db_rows(
            root, "SELECT state FROM candidates WHERE run_id = ? AND state NOT IN "
                  "('advanced', 'abandoned', 'stale')", (run_id,)))
    return {"stories": dict(sorted(stories.items())), "candidates": dict(cands)}


def first_parent_trees(root: Path) -> list[tuple[str, int]]:
    out = []
    for line in git(root, "rev-list", "--first-parent", "--reverse", "--parents", "main").splitlines():
        sha, *parents = line.split()
        out.append((git(root, "rev-parse", f"{sha}^{{tree}}"), len(parents)))
    return out


def namespace_refs(root: Path) -> list[str]:
    out = git(root, "for-each-ref", "--format=%(refname)", *NAMESPACES)
    return [line for line in out.splitlines() if line]


def worktrees(root: Path) -> list[str]:
    out = git(root, "worktree", "list", "--porcelain")
    return [line.split(" ", 1)[1] for line in out.splitlines() if line.startswith("worktree ")]


def leftover_agents(run_id: str) -> list[int]:
    """Processes still alive whose environment names this run (agent sessions)."""
    found = []
    needle = f"BMAD_LOOP_RUN_ID={run_id}".encode()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            if needle in (entry / "environ").read_bytes().split(b"\0"):
                stat = (entry / "stat").read_text()
                if stat[stat.rfind(")") + 2:].split()[0] != "Z":
                    found.append(int(entry.name))
        except OSError:
            continue
    return found


# ------------------------------------------------------------------------------ consumers
@dataclass
class Consumer:
    kind: str  # "stories" | "integration"
    index: int
    argv: list[str]
    log: Path
    proc: subprocess.Popen | None = None
    starts: int = 0
    kills: int = 0
    frozen_until: float | None = None

    @property
    def label(self) -> str:
        return f"{self.kind}#{self.index}"

    def start(self) -> None:
        with open(self.log, "ab") as handle:
            handle.write(f"\n=== start {self.starts + 1} at {time.time():.3f}\n".encode())
            handle.flush()
            self.proc = subprocess.Popen(self.argv, env=child_env(), stdout=handle,
                                         stderr=subprocess.STDOUT)
        self.starts += 1

    def kill(self) -> int:
        pid = self.proc.pid
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()
        self.kills += 1
        self.frozen_until = None
        return pid

    def freeze(self, until: float) -> int:
        """SIGSTOP: the process stays alive (its pid too) but stops heartbeating."""
        self.proc.send_signal(signal.SIGSTOP)
        self.frozen_until = until
        return self.proc.pid

    def thaw(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)
        self.frozen_until = None

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        if self.frozen_until is not None:
            self.thaw()
        self.proc.send_signal(signal.SIGINT)
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def consumers_for(root: Path, logs: Path, *, parallel: int, story_consumers: int) -> list[Consumer]:
    base = [sys.executable, "-m", "bmad_loop", "worker", "--project", str(root)]
    out = [Consumer("stories", i + 1, base + ["--queue", "stories", "-w", str(parallel)],
                    logs / f"stories-{i + 1}.log") for i in range(story_consumers)]
    out.append(Consumer("integration", 1, base + ["--queue", "integration", "-w", "1"],
                        logs / "integration-1.log"))
    return out


@dataclass
class Soak:
    name: str
    root: Path
    run_id: str = ""
    state: str | None = None
    wall_s: float = 0.0
    kills: list[dict] = field(default_factory=list)
    restarts_unasked: list[dict] = field(default_factory=list)
    consumers: list[Consumer] = field(default_factory=list)
    timed_out: bool = False
    status_counts: list[int] = field(default_factory=list)  # git status runs per editor thread
    stale_locks: int = 0  # stale bmad-loop index.lock files left


def status_loops(root: Path, count: int, stop) -> list:
    """Threads running plain `git status` in `root` until `stop` is set; their counters."""
    counts = [0] * count
    env = {k: v for k, v in os.environ.items() if k != "GIT_OPTIONAL_LOCKS"}

    def loop(i):
        while not stop.is_set():
            subprocess.run(["git", "status", "--porcelain"], cwd=root, capture_output=True, env=env)
            counts[i] += 1

    for i in range(count):
        threading.Thread(target=loop, args=(i,), daemon=True).start()
    return counts


def leave_stale_index_lock(root: Path) -> bool:
    """An index.lock like the one a lane killed mid-advance leaves: bmad-loop's marker, a dead
    pid on this host. False when the lock is held right now (a live holder: leave it)."""
    from bmad_loop.hostid import host_name
    from bmad_loop.git.locks import INDEX_LOCK_MARKER as MARKER

    dead = subprocess.Popen(["true"])
    dead.wait()
    try:
        fd = os.open(root / ".git" / "index.lock", os.O_CREAT | os.O_EXCL | os.O_WRONLY)
    except FileExistsError:
        return False
    with os.fdopen(fd, "wb") as handle:
        handle.write(MARKER + f" {host_name()} {dead.pid}\n".encode())
    return True


def drive(soak: Soak, *, parallel: int, story_consumers: int, deadline_s: float,
          rng: random.Random | None, min_kill_s: float, max_kill_s: float, say,
          freeze_s: float = 0.0, status_loop_count: int = 0, stale_lock_p: float = 0.0,
          aim_at: Path | None = None) -> Soak:
    """`aim_at` (a calls file): half the kills wait for an agent session in flight and hit
    the story consumer running it (kill -9 during agent sessions)."""
    """Enqueue the sprint and run it with consumer subprocesses; kill them if `rng` is given."""
    root = soak.root
    logs = root.parent / f"{soak.name}-logs"
    logs.mkdir(exist_ok=True)
    soak.run_id = cli(root, "enqueue").stdout.strip().splitlines()[-1]
    soak.consumers = consumers_for(root, logs, parallel=parallel, story_consumers=story_consumers)
    t0 = time.monotonic()
    for consumer in soak.consumers:
        consumer.start()
    next_kill = t0 + rng.uniform(min_kill_s, max_kill_s) if rng else None
    editors_stop = threading.Event()
    soak.status_counts = status_loops(root, status_loop_count, editors_stop)
    try:
        while True:
            now = time.monotonic()
            soak.state = run_state(root, soak.run_id)
            if soak.state in SETTLED:
                break
            if now - t0 > deadline_s:
                soak.timed_out = True
                break
            for consumer in soak.consumers:  # a consumer that died on its own: note it, restart
                if consumer.proc.poll() is not None:
                    soak.restarts_unasked.append({"t": round(now - t0, 2), "consumer": consumer.label,
                                                  "exit": consumer.proc.returncode})
                    say(f"  [{soak.name}] {consumer.label} exited {consumer.proc.returncode} "
                        "by itself; restarting")
                    consumer.start()
            for consumer in soak.consumers:
                if consumer.frozen_until is not None and now >= consumer.frozen_until:
                    consumer.thaw()
                    say(f"  [{soak.name}] t={now - t0:6.1f}s SIGCONT {consumer.label}")
            if next_kill is not None and now >= next_kill:
                if stale_lock_p and rng.random() < stale_lock_p and leave_stale_index_lock(root):
                    soak.stale_locks += 1
                    say(f"  [{soak.name}] t={now - t0:6.1f}s left a stale index.lock (dead pid)")
                victim = rng.choice(soak.consumers)
                if aim_at is not None and rng.random() < 0.5:
                    if not hostile_mod.session_in_flight(aim_at):
                        time.sleep(0.05)
                        continue  # wait for a session, then kill its consumer
                    victim = next(c for c in soak.consumers if c.kind == "stories")
                flight = in_flight(root, soak.run_id)
                if freeze_s > 0 and rng.random() < 0.5 and victim.frozen_until is None:
                    pid = victim.freeze(now + freeze_s)
                    soak.kills.append({"t": round(now - t0, 2), "at": time.time(),
                                       "consumer": victim.label, "kind": victim.kind,
                                       "pid": pid, "signal": "SIGSTOP", **flight})
                    say(f"  [{soak.name}] t={now - t0:6.1f}s SIGSTOP {victim.label} (pid {pid}) "
                        f"for {freeze_s:g}s; in flight {flight}")
                    next_kill = now + rng.uniform(min_kill_s, max_kill_s)
                    continue
                killed_at = time.time()
                pid = victim.kill()
                victim.start()
                integrated = flight["stories"].get("integrated", 0)
                soak.kills.append({"t": round(now - t0, 2), "at": killed_at, "consumer": victim.label,
                                   "kind": victim.kind, "pid": pid, "signal": "SIGKILL", **flight})
                say(f"  [{soak.name}] t={now - t0:6.1f}s SIGKILL {victim.label} (pid {pid}); "
                    f"integrated {integrated}; in flight {flight}")
                next_kill = now + rng.uniform(min_kill_s, max_kill_s)
            time.sleep(0.1)
    finally:
        editors_stop.set()
        soak.wall_s = time.monotonic() - t0
        for consumer in soak.consumers:
            consumer.stop()
    return soak


# ------------------------------------------------------------------------------ the checks
def journal(root: Path, run_id: str) -> list[dict]:
    out = cli(root, "journal", run_id, "--json").stdout
    return [json.loads(line) for line in out.splitlines() if line.strip()]


def _epoch(ts: str) -> float:
    import datetime as dt

    value = dt.datetime.fromisoformat(ts.replace("Z", "+00:00"))
    if value.tzinfo is None:
        value = value.replace(tzinfo=dt.timezone.utc)
    return value.timestamp()


def analyse(soak: Soak, keys: list[str], reference_trees, calls: Path) -> dict:
    root, run_id = soak.root, soak.run_id
    status = json.loads(cli(root, "status", run_id, "--json").stdout)
    events = journal(root, run_id)
    per_story = collections.defaultdict(collections.Counter)
    kinds = collections.Counter()
    for e in events:
        kinds[e["kind"]] += 1
        if e["story"]:
            per_story[e["story"]][e["kind"]] += 1
    duplicates = {k: {"story.integrated": c["story.integrated"], "target.advanced": c["target.advanced"]}
                  for k, c in per_story.items()
                  if c["story.integrated"] > 1 or c["target.advanced"] > 1}
    states = collections.Counter(s["state"] for s in status["stories"])
    trees = first_parent_trees(root)
    checkout_clean = git(root, "status", "--porcelain", "--untracked-files=no") == ""
    head_follows = git(root, "rev-parse", "HEAD") == git(root, "rev-parse", "main")
    agents_left = leftover_agents(run_id)
    cleanup = json.loads(cli(root, "cleanup", "--json").stdout)
    left_worktrees = [w for w in worktrees(root) if Path(w).resolve() != root.resolve()]
    # A cut-short session's output (`…/sessions/<story>/<phase>-<n>.cut`) is evidence kept
    # until the finished run is pruned (`cleanup --runs`): not debris.
    left_refs = [r for r in namespace_refs(root) if not r.endswith(".cut")]
    evidence_refs = [r for r in namespace_refs(root) if r.endswith(".cut")]
    sessions = collections.Counter()
    spans: dict[tuple, dict] = {}
    if calls.exists():
        for line in calls.read_text().splitlines():
            row = json.loads(line)
            if row["event"] == "start":
                sessions[row["phase"]] += 1
                spans[(row["pid"], row["key"])] = {"key": row["key"], "phase": row["phase"], "start": row["t"], "end": None}
            elif (row["pid"], row["key"]) in spans:
                spans[(row["pid"], row["key"])]["end"] = row["t"]
    cut_off = sum(1 for x in spans.values() if x["end"] is None)
    foreign_seen = sorted({f"{row['key']}: {p}" for row in _calls(calls) for p in row.get("foreign", [])})
    # Two sessions of one story alive at once (an orphaned agent still writing the worktree
    # while its replacement runs): a session that ended after a later one of its story began.
    overlaps = [(a["key"], a["phase"], b["phase"]) for a in spans.values() for b in spans.values()
                if a is not b and a["key"] == b["key"] and a["end"] is not None
                and a["start"] < b["start"] < a["end"]]
    attempts = collections.Counter(
        f"{phase}:{state}" for phase, state in db_rows(
            root, "SELECT phase, state FROM attempts WHERE run_id = ?", (run_id,)))
    # After the run: no attempt may still be `running`, and since this agent never fails, each
    # story has exactly one counted dev attempt (a second one is a stale worker's word counted).
    dangling = [f"{key} {phase} #{att_id}" for key, phase, att_id in db_rows(
        root, "SELECT s.key, a.phase, a.id FROM attempts a JOIN stories s ON s.id = a.story_id "
              "WHERE a.run_id = ? AND a.state = 'running'", (run_id,))]
    over_counted = {key: n for key, n in db_rows(
        root, "SELECT key, dev_attempts FROM stories WHERE run_id = ? AND dev_attempts != 1", (run_id,))}
    cand_states = collections.Counter(
        state for (state,) in db_rows(root, "SELECT state FROM candidates WHERE run_id = ?", (run_id,)))
    kills = collections.Counter(k["kind"] for k in soak.kills if k["signal"] == "SIGKILL")
    freezes = collections.Counter(k["kind"] for k in soak.kills if k["signal"] == "SIGSTOP")
    for kill in soak.kills:  # the last journal events before each kill: where it landed
        before = [e for e in events if _epoch(e["ts"]) <= kill["at"]]
        kill["last_events"] = [f"{e['seq']} {e['kind']} {e['story'] or ''}".strip() for e in before[-3:]]
    return {
        "name": soak.name,
        "root": str(root),
        "run_id": run_id,
        "run_state": status["run"]["state"],
        "run_reason": status["run"].get("reason"),
        "timed_out": soak.timed_out,
        "wall_s": round(soak.wall_s, 1),
        "stories": len(keys),
        "story_states": dict(states),
        "integrated": states.get("integrated", 0),
        "integrated_events": kinds["story.integrated"],
        "advanced_events": kinds["target.advanced"],
        "duplicates": duplicates,
        "never_integrated": sorted(k for k in keys if per_story[k]["story.integrated"] == 0),
        "target_commits": len(trees),
        "trees": trees,
        "history_matches": None if reference_trees is None else trees == reference_trees,
        "checkout_clean": checkout_clean,
        "head_follows_target": head_follows,
        "leftover_agents": agents_left,
        "cleanup_removed": {k: len(cleanup.get(k, [])) for k in
                            ("worktrees_removed", "branches_deleted", "refs_deleted", "rows_marked")},
        "cleanup_kept": cleanup.get("kept", []),
        "cleanup_report": cleanup,
        "worktrees_after_cleanup": left_worktrees,
        "refs_after_cleanup": left_refs,
        "evidence_refs": evidence_refs,
        "kills": dict(kills),
        "kills_total": sum(kills.values()),
        "freezes": dict(freezes),
        "kill_log": soak.kills,
        "unasked_exits": soak.restarts_unasked,
        "starts": {c.label: c.starts for c in soak.consumers},
        "agent_sessions": dict(sessions),
        "sessions_cut_off": cut_off,
        "overlapping_sessions": overlaps,
        "attempts": dict(attempts),
        "candidates": dict(cand_states),
        "attempts_left_running": dangling,
        "dev_attempts_not_1": over_counted,
        "recovery": {k: kinds[k] for k in ("story.recovered", "candidate.abandoned", "candidate.stale",
                                           "lane.acquired", "lane.fenced", "story.escalated",
                                           "run.failed", "run.paused", "fault.retry",
                                           "git.lock_waited", "git.stale_lock_removed") if kinds[k]},
        "runs_failed": int(status["run"]["state"] in ("failed", "paused")),
        "stories_lost": len(keys) - states.get("integrated", 0),
        "edits_lost": edits_lost(root, keys),
        "leftovers_seen": foreign_seen,
        "git_status_runs": sum(soak.status_counts),
        "stale_locks_left": soak.stale_locks,
        "stale_locks_removed": kinds["git.stale_lock_removed"],
        "session_restored": kinds["session.restored"],
    }


def _calls(calls: Path) -> list[dict]:
    return [json.loads(line) for line in calls.read_text().splitlines()] if calls.exists() else []


def edits_lost(root: Path, keys: list[str]) -> list[str]:
    """The stories whose files on the target are not what their agent wrote (an edit hidden
    behind an index flag, or a new file marked intent-to-add, that a commit dropped)."""
    tree = {}
    for line in git(root, "ls-tree", "-r", "main", "work").splitlines():
        meta, path = line.split("\t", 1)
        tree[path] = meta.split()[2]
    lost = []
    for key in keys:
        name = key.split("-", 2)[-1]
        for path, text in ((f"work/{name}.txt", f"story {key}\n"), (f"work/{name}.extra", f"extra {key}\n")):
            if path not in tree or git(root, "cat-file", "blob", tree[path]) != text.strip():
                lost.append(path)
    return lost


def verdict(result: dict) -> list[str]:
    """The checks that failed (empty: all held)."""
    bad = []
    if result["timed_out"]:
        bad.append(f"run not settled before the deadline (state {result['run_state']})")
    if result["run_state"] != "completed":
        bad.append(f"run {result['run_state']}: {result['run_reason']}")
    if result["integrated"] != result["stories"]:
        bad.append(f"{result['integrated']}/{result['stories']} stories integrated")
    if result["duplicates"]:
        bad.append(f"duplicates: {result['duplicates']}")
    if result["history_matches"] is False:
        bad.append("the target's tree sequence differs from the reference run's")
    if result["target_commits"] != result["stories"] + 1:
        bad.append(f"target has {result['target_commits']} first-parent commits, "
                   f"expected {result['stories'] + 1}")
    if not result["checkout_clean"] or not result["head_follows_target"]:
        bad.append("the target checkout is dirty or does not follow the target")
    if result["overlapping_sessions"]:
        bad.append(f"two agent sessions of one story ran at once: {result['overlapping_sessions']}")
    if result["attempts_left_running"]:
        bad.append(f"attempt rows still running after the run: {result['attempts_left_running']}")
    if result["dev_attempts_not_1"]:
        bad.append(f"stories whose counted dev attempts are not 1: {result['dev_attempts_not_1']}")
    if result["edits_lost"]:
        bad.append(f"agent edits missing from the target: {result['edits_lost']}")
    if result["leftovers_seen"]:
        bad.append(f"agents found another story's flags or files: {result['leftovers_seen']}")
    if result["leftover_agents"]:
        bad.append(f"agent processes left running: {result['leftover_agents']}")
    if result.get("hostile", {}).get("breaks"):
        bad.append("hostile agents broke items " + ", ".join(
            f"{item} ({'; '.join(why)[:300]})" for item, why in result["hostile"]["breaks"].items()))
    if result["run_state"] == "completed" and (result["worktrees_after_cleanup"]
                                               or result["refs_after_cleanup"]):
        bad.append(f"debris after cleanup: {result['worktrees_after_cleanup']} "
                   f"{result['refs_after_cleanup']}")
    return bad


def report(ref: dict | None, chaos: dict, args, bad: list[str], say) -> None:
    say("")
    say("where each kill landed (the last journal event before it):")
    for kill in chaos["kill_log"]:
        say(f"  t={kill['t']:6.1f}s {kill['signal']} {kill['consumer']:<14} after {kill['last_events'][-1] if kill['last_events'] else '-'}")
    say("")
    say(f"chaos soak: {chaos['stories']} stories, max_parallel {args.parallel}, "
        f"{args.story_consumers} story consumer(s) + 1 lane, seed {args.seed}, "
        f"kill every {args.min_kill_s:g}-{args.max_kill_s:g} s")
    kills = chaos["kills"]
    say(f"  kills survived:        {chaos['kills_total']} "
        f"(stories {kills.get('stories', 0)}, integration {kills.get('integration', 0)})")
    if args.freeze_s:
        say(f"  freezes survived:      {sum(chaos['freezes'].values())} {chaos['freezes']} "
            f"(SIGSTOP for {args.freeze_s:g} s, then SIGCONT)")
    say(f"  runs failed:           {chaos['runs_failed']} (must be 0); stories lost: "
        f"{chaos['stories_lost']} (must be 0)")
    say(f"  editor git status:     {chaos['git_status_runs']} runs beside the soak; stale index "
        f"locks left {chaos['stale_locks_left']}, removed by the lane {chaos['stale_locks_removed']}")
    say(f"  hostile agents:        edits missing from the target {len(chaos['edits_lost'])}, "
        f"another story's flags or files seen {len(chaos['leftovers_seen'])} (both must be 0)")
    say(f"  stories integrated:    {chaos['integrated']}/{chaos['stories']} "
        f"(run {chaos['run_state']}{'; TIMED OUT' if chaos['timed_out'] else ''})")
    say(f"  duplicates found:      {len(chaos['duplicates'])}"
        + (f" {chaos['duplicates']}" if chaos["duplicates"] else "")
        + f" (story.integrated {chaos['integrated_events']}, target.advanced "
          f"{chaos['advanced_events']})")
    match = chaos["history_matches"]
    say(f"  history matches:       {'n/a (no reference)' if match is None else 'yes' if match else 'NO'}"
        f" ({chaos['target_commits']} first-parent trees)")
    say(f"  cleanup --json:        removed {chaos['cleanup_removed']}; after it: "
        f"{len(chaos['worktrees_after_cleanup'])} worktrees, "
        f"{len(chaos['refs_after_cleanup'])} refs in bmad-loop's namespaces"
        + ("" if chaos["run_state"] == "completed" else
           f" (run {chaos['run_state']}: its rows still own them)"))
    removed = [x for k in ("worktrees_removed", "branches_deleted", "refs_deleted")
               for x in chaos["cleanup_report"].get(k, [])]
    if removed:
        say(f"    (left by kills, removed by cleanup: {', '.join(removed)})")
    say(f"  checkout follows:      {chaos['checkout_clean'] and chaos['head_follows_target']}; "
        f"leftover agents: {len(chaos['leftover_agents'])}")
    say(f"  recovery on record:    {chaos['recovery']}")
    say(f"  agent sessions:        {chaos['agent_sessions']} ({chaos['sessions_cut_off']} cut off by a kill, "
        f"{len(chaos['overlapping_sessions'])} overlapping another of their story); "
        f"attempts {chaos['attempts']}")
    say(f"  candidates:            {chaos['candidates']}")
    say(f"  rows after the run:    attempts still running {chaos['attempts_left_running'] or 0}; "
        f"stories with counted dev attempts != 1: {chaos['dev_attempts_not_1'] or 0}")
    if chaos["unasked_exits"]:
        say(f"  consumers that exited by themselves: {chaos['unasked_exits']}")
    say(f"  wall time:             chaos {chaos['wall_s']} s"
        + (f", uninterrupted {ref['wall_s']} s" if ref else ""))
    if "hostile" in chaos:
        say(f"  hostile tries by item: {chaos['hostile']['tries']} ([tries, writes that went "
            f"through]); sessions re-run from their start tree: {chaos['session_restored']}")
        for item, why in chaos["hostile"]["breaks"].items():
            say(f"    item {item} BROKE: {'; '.join(why)[:400]}")
        if not chaos["hostile"]["breaks"]:
            say("    no item broke")
    say(f"  verdict:               {'PASS' if not bad else 'FAIL: ' + '; '.join(bad)}")
    say(f"  repositories:          {Path(chaos['root']).parent}"
        + ("" if args.keep else " (removed; --keep keeps them)"))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--stories", type=int, default=30)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--parallel", type=int, default=3)
    parser.add_argument("--min-kill-s", type=float, default=3.0)
    parser.add_argument("--max-kill-s", type=float, default=8.0)
    parser.add_argument("--story-consumers", type=int, default=1, choices=(1, 2),
                        help="story consumer processes (each -w PARALLEL)")
    parser.add_argument("--deadline-s", type=float, default=900.0)
    parser.add_argument("--quick", action="store_true", help="10 stories")
    parser.add_argument("--dir", type=Path, help="work folder (default: a new temporary one)")
    parser.add_argument("--keep", action="store_true", help="keep the repositories and logs")
    parser.add_argument("--no-reference", action="store_true",
                        help="skip the uninterrupted run (no history comparison)")
    parser.add_argument("--json", action="store_true", help="print every figure as JSON too")
    parser.add_argument("--status-loops", type=int, default=2,
                        help="threads running `git status` in the target checkout (an editor)")
    parser.add_argument("--stale-locks", type=float, default=0.3,
                        help="probability that a fault also leaves a stale bmad-loop index.lock")
    parser.add_argument("--hostile", type=float, default=None, metavar="P",
                        help="each dev session of the chaos run tries one of issue 45's breaks "
                             "(items 1-8) with probability P, and half the kills land during "
                             "agent sessions (bench/chaos_hostile.py); its own HOME")
    parser.add_argument("--hostile-items", default="1,2,3,4,5,6,7,8",
                        help="the items of issue 45 the hostile agents draw from (comma-separated)")
    parser.add_argument("--freeze-s", type=float, default=0.0,
                        help="also freeze consumers: half the faults become SIGSTOP for this many "
                             "seconds, then SIGCONT (a stalled process whose pid stays alive: its "
                             "leases expire after ttl_s = 3). Off by default")
    args = parser.parse_args(argv)
    if args.quick:
        args.stories = 10
    if not 0 < args.min_kill_s <= args.max_kill_s:
        parser.error("--min-kill-s must be > 0 and <= --max-kill-s")

    def say(msg):
        print(msg, flush=True)

    work = (args.dir or Path(tempfile.mkdtemp(prefix="bmad-chaos-"))).resolve()
    work.mkdir(parents=True, exist_ok=True)
    agent = work / "agent.py"
    agent.write_text(hostile_mod.agent_source(AGENT) if args.hostile is not None else AGENT)
    if args.hostile is not None:
        HOSTILE_HOME.append(work / "home")
        (work / "home").mkdir(exist_ok=True)
    (work / VERIFY_FILE).write_text(VERIFY)
    keys = story_keys(args.stories)
    say(f"work folder {work}")
    ref_result = None
    reference_trees = None
    try:
        if not args.no_reference:
            root = work / "reference"
            calls = work / "reference.calls"
            build_repo(root, keys, parallel=args.parallel, agent=agent, seed=args.seed, calls=calls,
                       hostile=0.0 if args.hostile is not None else None)
            say(f"reference: uninterrupted run of {len(keys)} stories ...")
            soak = drive(Soak("reference", root), parallel=args.parallel,
                         story_consumers=args.story_consumers, deadline_s=args.deadline_s,
                         rng=None, min_kill_s=args.min_kill_s, max_kill_s=args.max_kill_s, say=say)
            ref_result = analyse(soak, keys, None, calls)
            ref_bad = verdict(ref_result)
            say(f"reference: {ref_result['run_state']} in {ref_result['wall_s']} s, "
                f"{ref_result['integrated']} integrated" + (f"; PROBLEM: {ref_bad}" if ref_bad else ""))
            reference_trees = ref_result["trees"]
        root = work / "chaos"
        calls = work / "chaos.calls"
        build_repo(root, keys, parallel=args.parallel, agent=agent, seed=args.seed, calls=calls,
                   hostile=args.hostile, items=args.hostile_items)
        say(f"chaos: {len(keys)} stories, SIGKILL every {args.min_kill_s:g}-{args.max_kill_s:g} s ...")
        soak = drive(Soak("chaos", root), parallel=args.parallel,
                     story_consumers=args.story_consumers, deadline_s=args.deadline_s,
                     rng=random.Random(args.seed), min_kill_s=args.min_kill_s,
                     max_kill_s=args.max_kill_s, say=say, freeze_s=args.freeze_s,
                     status_loop_count=args.status_loops, stale_lock_p=args.stale_locks,
                     aim_at=calls if args.hostile is not None else None)
        chaos = analyse(soak, keys, reference_trees, calls)
        if args.hostile is not None:
            chaos["hostile"] = hostile_mod.breaks(root, _calls(calls), chaos, git)
        bad = verdict(chaos)
        if ref_result is not None and verdict(ref_result):
            bad.append("the reference run itself failed: " + "; ".join(verdict(ref_result)))
        report(ref_result, chaos, args, bad, say)
        if args.json:
            def brief(r):
                return r and {k: v for k, v in r.items() if k != "trees"}
            print(json.dumps({"reference": brief(ref_result), "chaos": brief(chaos),
                              "failed_checks": bad}, indent=2, default=str))
        return 0 if not bad else 1
    finally:
        if args.hostile is not None:
            hostile_mod.remove_plants()  # item 3's .pth must never outlive the soak
        if not args.keep and args.dir is None:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
