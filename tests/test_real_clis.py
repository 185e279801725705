"""The shipped profiles against the real CLIs: claude, codex, gemini, opencode and qwen.

Each CLI is the pinned release `.ci/run` installs from npm (its profile's `checked_version`), in
the folder named by BMAD_LOOP_REALCLI_DIR (default: `.realcli/` of this checkout, git-ignored).
bmad-loop runs with the CLI's profile inside a loopback-only network namespace, beside the fake
model server of tests/realcli/fakemodel.py, which drives one agent turn through the CLI's own
tools: it reads the prompt file, writes the file the story names, and a review answers with its
verdict. Each CLI has a private HOME with its telemetry, update checks and plugin installs off, and
HTTPS_PROXY/HTTP_PROXY naming a proxy that refuses and counts every request: every test asserts
that nothing tried to leave loopback.

Marked `realcli`: `pytest -m realcli` runs these alone (the summary says how long they took).
A missing CLI skips them on a workstation and fails them in CI (CI=true).
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from support import CI, STORY_DIR, StoryDef, cli_argv, query

sys.path.insert(0, str(Path(__file__).resolve().parent / "realcli"))

from clihomes import CLIS, Ports, prepare  # noqa: E402
from fakemodel import USAGE  # noqa: E402

pytestmark = pytest.mark.realcli

ROOT = Path(__file__).resolve().parents[1]
CLI_DIR = Path(os.environ.get("BMAD_LOOP_REALCLI_DIR") or ROOT / ".realcli")
RUNNER = Path(__file__).resolve().parent / "realcli" / "netns_run.py"
PORTS = Ports(model=18080, proxy=18081, seed=CLI_DIR / "seed")  # private to each namespace
ALPHA = StoryDef("1-1-alpha", files=["src/alpha.py"])
BETA = StoryDef("1-2-beta", files=["src/beta.py"])
WRITTEN = "# written by the {phase} session {n}\nVALUE = {n}\n"


def _unshare() -> list[str]:
    """`unshare -n` as root; elsewhere a user namespace maps us to root for it (`-r`)."""
    if not shutil.which("unshare"):
        return []
    return ["unshare", "-n"] if os.geteuid() == 0 else ["unshare", "-r", "-n"]


@pytest.fixture(scope="session")
def cli_bin() -> Path:
    """The folder of the installed CLIs; a missing CLI fails in CI and skips elsewhere."""
    folder = CLI_DIR / "node_modules" / ".bin"
    missing = [name for name in CLIS if not (folder / name).exists()]
    problem = f"real CLIs missing in {folder}: {', '.join(missing)} (.ci/run installs them)" if missing \
        else None if _unshare() else "no `unshare` for a loopback-only network namespace"
    if problem is None and subprocess.run([*_unshare(), "true"], capture_output=True).returncode != 0:
        problem = "cannot make a network namespace here (`unshare -n` refused)"
    if problem:
        if CI:
            pytest.fail(problem)
        pytest.skip(problem)
    return folder


@dataclasses.dataclass
class Outcome:
    steps: list[dict]
    model: dict
    proxy: list[str]

    def rc(self, n: int = 0):
        return self.steps[n]["rc"]


class Sprint:
    """One project driven with one CLI's profile (see the module docstring)."""

    def __init__(self, make_repo, tmp_path: Path, cli_bin: Path, cli: str, stories, policy: str = ""):
        self.cli = cli
        # A long lease: on a loaded machine a slow heartbeat must not hand the story to another worker.
        self.repo = make_repo(stories, policy=f"{policy}\n[leases]\nttl_s = 300\n"
                                             f"[adapter]\nprofile = \"{cli}\"\ntimeout_s = 180\n")
        self.tmp = tmp_path
        env = {k: v for k, v in os.environ.items() if not k.lower().endswith("_proxy")}
        env.update(prepare(cli, tmp_path / f"{cli}-home", PORTS))
        env["PATH"] = f"{cli_bin}{os.pathsep}{env['PATH']}"
        self.env = env

    def run(self, *steps: tuple[dict, tuple[str, ...]]) -> Outcome:
        """Each step: (the server's scenario, bmad-loop arguments after the command)."""
        job = self.tmp / "job.json"
        result = self.tmp / "result.json"
        # opencode migrates its database at its first start, and two first starts at once race on
        # it (one exits 1, "Failed query: CREATE TABLE …"): a user has started it before; so here.
        warm = [{"argv": ["opencode", "session", "list"], "env": self.env, "cwd": str(self.repo.root),
                 "timeout": 300}] if self.cli == "opencode" else []
        job.write_text(json.dumps({
            "model_port": PORTS.model, "proxy_port": PORTS.proxy, "result": str(result),
            "steps": warm + [{"scenario": scenario, "timeout": 420, "env": self.env,
                              "argv": cli_argv(args[0], "--project", str(self.repo.root), *args[1:])}
                             for scenario, args in steps]}))
        subprocess.run([*_unshare(), sys.executable, str(RUNNER), str(job)], check=True, timeout=900)
        outcome = Outcome(**json.loads(result.read_text()))
        outcome.steps = outcome.steps[len(warm):]
        # Nothing tried to leave loopback through the proxy, and every request was one the fake knows.
        assert outcome.proxy == [], outcome.proxy
        assert outcome.model["unknown"] == [], outcome.model["unknown"]
        return outcome

    def attempts(self) -> list[tuple]:
        return query(self.repo, "SELECT phase, state, counted, reason FROM attempts ORDER BY id")

    def log(self, outcome: Outcome) -> str:
        logs = sorted((self.repo.root / ".bmad-loop").rglob("*.log"))
        tails = "\n".join(f"--- {p.name}\n{p.read_text(errors='replace')[-1500:]}" for p in logs[-4:])
        return f"{json.dumps(outcome.steps, indent=1)[-3000:]}\n{tails}"


@pytest.fixture(params=CLIS)
def cli(request) -> str:
    return request.param


def sprint(make_repo, tmp_path, cli_bin, cli, stories=(ALPHA,), policy=""):
    return Sprint(make_repo, tmp_path, cli_bin, cli, list(stories), policy)


def assert_usage_recorded(s: Sprint) -> None:
    """The CLI's token report reached the attempts: input without cache reads, output, cache reads."""
    rows = query(s.repo, "SELECT input_tokens, output_tokens, cache_read_tokens FROM attempts "
                         "WHERE state = 'succeeded'")
    assert rows, "no succeeded session"
    for fresh, out, cached in rows:
        assert out and out >= USAGE["output"], rows
        assert cached and cached >= USAGE["cached"], rows
        assert fresh is not None and fresh % (USAGE["input"] - USAGE["cached"]) == 0, rows  # no cache in it


def test_a_sprint_of_two_stories_at_n_2_is_developed_reviewed_and_integrated(make_repo, tmp_path, cli_bin, cli):
    s = sprint(make_repo, tmp_path, cli_bin, cli, (ALPHA, BETA), '[scm]\nmax_parallel = 2\n')
    outcome = s.run(({}, ("run",)))
    assert outcome.rc() == 0, s.log(outcome)
    assert {st["key"]: st["state"] for st in s.repo.status()["stories"]} == {
        "1-1-alpha": "integrated", "1-2-beta": "integrated"}
    for path in ("src/alpha.py", "src/beta.py"):
        assert s.repo.git("show", f"main:{path}") + "\n" == WRITTEN.format(phase="dev", n=1)
    assert sorted(s.attempts()) == [("dev", "succeeded", 1, None)] * 2 + [("review", "succeeded", 1, None)] * 2
    assert_usage_recorded(s)


def test_in_place_the_cli_reads_its_prompt_and_the_story_integrates(make_repo, tmp_path, cli_bin, cli):
    s = sprint(make_repo, tmp_path, cli_bin, cli, policy='[scm]\nisolation = "none"\n')
    outcome = s.run(({}, ("run",)))
    assert outcome.rc() == 0, s.log(outcome)
    assert s.repo.story("1-1-alpha")["state"] == "integrated"
    assert s.repo.git("show", "main:src/alpha.py") + "\n" == WRITTEN.format(phase="dev", n=1)


def test_changes_requested_are_fixed_and_the_second_review_approves(make_repo, tmp_path, cli_bin, cli):
    s = sprint(make_repo, tmp_path, cli_bin, cli)
    outcome = s.run(({"reject_reviews": 1}, ("run",)))
    assert outcome.rc() == 0, s.log(outcome)
    assert [(row[0], row[3]) for row in s.attempts()] == [
        ("dev", None), ("review", "review requested changes"), ("fix", None), ("review", None)]
    assert s.repo.story("1-1-alpha")["state"] == "integrated"
    assert s.repo.git("show", "main:src/alpha.py").startswith("# written by the fix session")


def test_a_429_on_every_call_pauses_charging_nothing_and_resume_integrates(make_repo, tmp_path, cli_bin, cli):
    s = sprint(make_repo, tmp_path, cli_bin, cli)
    run_id_args = ("resume",)  # the run's id is read from status below, once paused
    outcome = s.run(({"status": 429}, ("run",)))
    assert outcome.rc() == 3, s.log(outcome)
    status = s.repo.status()
    assert status["run"]["state"] == "paused" and "rate-limit" in status["run"]["reason"], status["run"]
    story = s.repo.story("1-1-alpha")
    assert story["state"] == "pending" and story["attempt"] == 0  # nothing charged
    assert [row[:3] for row in s.attempts()] == [("dev", "interrupted", 0)]
    assert "429" in s.attempts()[0][3] or "rate" in s.attempts()[0][3].lower(), s.attempts()
    outcome = s.run(({}, (*run_id_args, status["run"]["id"])))
    assert outcome.rc(0) == 0, s.log(outcome)
    assert s.repo.story("1-1-alpha")["state"] == "integrated"


@pytest.mark.parametrize("status", [529, 503])
def test_an_overloaded_model_pauses_the_run_charging_nothing(make_repo, tmp_path, cli_bin, cli, status):
    s = sprint(make_repo, tmp_path, cli_bin, cli)
    outcome = s.run(({"status": status}, ("run",)))
    assert outcome.rc() == 3, s.log(outcome)
    run = s.repo.status()["run"]
    assert run["state"] == "paused" and "rate-limit" in run["reason"], run
    assert "Reading additional input from stdin" not in run["reason"]  # the CLI's own words
    assert [row[:3] for row in s.attempts()] == [("dev", "interrupted", 0)]
    assert s.repo.story("1-1-alpha")["attempt"] == 0


def test_one_429_the_cli_retries_by_itself_is_a_success(make_repo, tmp_path, cli_bin, cli):
    s = sprint(make_repo, tmp_path, cli_bin, cli)
    outcome = s.run(({"status": 429, "fail_first": 1}, ("run",)))
    assert outcome.rc() == 0, s.log(outcome)
    assert outcome.model["faults_sent"] == 1
    assert [row[:2] for row in s.attempts()] == [("dev", "succeeded"), ("review", "succeeded")]
    assert [e for e in s.repo.journal() if e["kind"] == "agent.unavailable"] == []
    assert s.repo.story("1-1-alpha")["state"] == "integrated"


def _sandbox_key_exists() -> bool:
    from bmad_loop.policy import schema

    adapter = next((c for c in vars(schema).values() if dataclasses.is_dataclass(c)
                    and c.__name__ == "AdapterPolicy"), None)
    return adapter is not None and "sandbox" in {f.name for f in dataclasses.fields(adapter)}


def test_with_the_sandbox_on_the_cli_works_inside_the_box(make_repo, tmp_path, cli_bin, cli):
    if not _sandbox_key_exists():
        pytest.skip("[adapter] sandbox does not exist yet in this build")
    s = sprint(make_repo, tmp_path, cli_bin, cli, policy=f"[scm]\nmax_parallel = 1\n")
    text = (s.repo.root / ".bmad-loop" / "policy.toml").read_text()
    (s.repo.root / ".bmad-loop" / "policy.toml").write_text(text.replace("[adapter]\n", '[adapter]\nsandbox = "on"\n'))
    outcome = s.run(({}, ("run",)))
    assert outcome.rc() == 0, s.log(outcome)
    assert s.repo.story("1-1-alpha")["state"] == "integrated"
    assert s.repo.git("show", "main:src/alpha.py") + "\n" == WRITTEN.format(phase="dev", n=1)


def test_the_proxy_counts_an_attempt_to_leave_loopback(tmp_path):
    """The zero every test above asserts could be otherwise: a client that honours HTTPS_PROXY and
    asks for a host on the internet is refused and counted."""
    if not _unshare() or subprocess.run([*_unshare(), "true"], capture_output=True).returncode != 0:
        pytest.skip("cannot make a network namespace here")
    env = {"PATH": os.environ["PATH"], **prepare("claude", tmp_path / "home", PORTS)}
    leave = "import urllib.request\ntry: urllib.request.urlopen('https://example.com/', timeout=10)\nexcept OSError: pass\n"
    job, result = tmp_path / "job.json", tmp_path / "result.json"
    job.write_text(json.dumps({"model_port": PORTS.model, "proxy_port": PORTS.proxy, "result": str(result),
                               "steps": [{"argv": [sys.executable, "-c", leave], "env": env}]}))
    subprocess.run([*_unshare(), sys.executable, str(RUNNER), str(job)], check=True, timeout=120)
    (attempt,) = json.loads(result.read_text())["proxy"]
    assert attempt.startswith("CONNECT example.com:443 ")
