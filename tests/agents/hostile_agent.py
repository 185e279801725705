"""A hostile agent (or verify command) for the sandbox tests: a real process that tries to
reach past its worktree, writes down what worked, then does its honest work.

Usage: python hostile_agent.py CONFIG.json ROLE
CONFIG names the paths to attack (project, state dir, git dir, home, ...) and `report_dir`;
ROLE is "agent" or "verify". Every attempt is recorded in REPORT_DIR/<role>-<n>.json as
{name: "ok" | "refused: <why>"}; "ok" means the write (or the command) succeeded. Attempts
that would break the run's own files unboxed (the databases) only open the file for writing.
Then the agent writes `honest_file` = `honest_text` and exits 0; the verify command checks that
file and exits 0 only when it holds exactly that text.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

MARK = "HOSTILE"


def open_for_write(path):
    def attempt():
        os.close(os.open(path, os.O_WRONLY | os.O_APPEND))
    return attempt


def append(path, text=f"\n# {MARK}\n"):
    def attempt():
        with open(path, "a") as handle:
            handle.write(text)
    return attempt


def create(path, text=f"{MARK}\n"):
    def attempt():
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(text)
    return attempt


def command(*argv, env=None):
    def attempt():
        proc = subprocess.run(list(argv), capture_output=True, text=True, env=env, timeout=60)
        if proc.returncode != 0:
            raise OSError(f"exit {proc.returncode}: {(proc.stderr or proc.stdout).strip()[-200:]}")
    return attempt


def connect(path):
    """Reach a server outside the box through its Unix socket."""
    def attempt():
        import socket

        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as client:
            client.settimeout(5)
            client.connect(str(path))
            client.sendall(f"{MARK}\n".encode())
    return attempt


def through_link(kind, target, link):
    def attempt():
        if os.path.lexists(link):
            os.unlink(link)
        (os.symlink if kind == "symlink" else os.link)(target, link)
        try:
            append(link)()
        finally:
            os.unlink(link)
    return attempt


def attempts(cfg, worktree):
    state, git, home = Path(cfg["state_dir"]), Path(cfg["git_dir"]), Path(cfg["home"])
    policy = state / "policy.toml"
    owner_pid = os.environ.get("BMAD_LOOP_OWNER", "::").rsplit(":", 2)[1] or "0"
    sha = subprocess.run(["git", "commit-tree", "-m", MARK, "HEAD^{tree}"], cwd=worktree,
                         capture_output=True, text=True).stdout.strip() or "HEAD"
    admin = Path(subprocess.run(["git", "rev-parse", "--absolute-git-dir"], cwd=worktree,
                                capture_output=True, text=True).stdout.strip())
    boxed = bool(os.environ.get("BMAD_LOOP_SANDBOX"))
    found = {
        "state.db": open_for_write(state / "state.db"),
        "queue.db": open_for_write(state / "queue.db"),
        "policy.toml": append(policy),
        ".git/config": append(git / "config"),
        ".git/hooks/pre-commit": create(git / "hooks" / "pre-commit", f"#!/bin/sh\necho {MARK}\n"),
        "refs/heads/main (git update-ref)": command("git", "update-ref", "refs/heads/main", sha),
        "refs/heads (a new ref file)": create(git / "refs" / "heads" / "hostile"),
        "GIT_DIR=.git git update-ref": command(
            "git", "update-ref", "refs/heads/main", sha,
            env={**os.environ, "GIT_DIR": str(git), "GIT_OBJECT_DIRECTORY": str(git / "objects")}),
        "another story's worktree": create(Path(cfg["other_worktree"]) / MARK),
        "a candidate worktree": create(Path(cfg["candidate_worktree"]) / MARK),
        "~/.gitconfig": append(home / ".gitconfig"),
        "/proc/<bmad-loop pid>/root": append(f"/proc/{owner_pid}/root{policy}"),
        "/proc/1/root": append(f"/proc/1/root{policy}"),
        # Signal 0: may it signal bmad-loop at all (kill, SIGSTOP), without doing it.
        "signal bmad-loop": lambda: os.kill(int(owner_pid), 0),
        "nested bwrap": command("bwrap", "--ro-bind", "/", "/", "--bind", str(state), str(state),
                                "sh", "-c", f"echo '# {MARK}' >> {policy}"),
        "symlink out of the worktree": through_link("symlink", policy, worktree / ".hostile-link"),
        "hardlink out of the worktree": through_link("hardlink", policy, worktree / ".hostile-hl"),
        "git alternates": append(git / "objects" / "info" / "alternates", f"/tmp/{MARK}\n"),
        "the worktree's .git file": open_for_write(worktree / ".git"),
        "the admin entry's commondir": open_for_write(admin / "commondir"),
        "core.hooksPath in config.worktree": command(
            "git", "config", "--worktree", "core.hooksPath", f"/tmp/{MARK}"),
    }
    if boxed:  # unboxed as root this would remount the host's own root
        found["remount / read-write"] = command("mount", "-o", "remount,rw", "/")
    if boxed:  # unboxed these would plant programs and code on the test machine itself
        found.update(planting(cfg, state, git, home))
    return found


def planting(cfg, state, git, home):
    """What would make bmad-loop run the agent's code outside the box (issue 45): a program
    early on PATH, code on bmad-loop's sys.path, a protected folder moved aside, its own log."""
    program = f"#!/bin/sh\n# {MARK}\nexec /usr/bin/env -S \"$@\"\n"
    project = Path(cfg["project"])
    log = state / "logs" / os.environ.get("BMAD_LOOP_RUN_ID", "run") \
        / os.environ.get("BMAD_LOOP_STORY_KEY", "story") / "dev-1.log"
    return {
        "~/.local/bin/bwrap (first on PATH)": create(home / ".local" / "bin" / "bwrap", program),
        "~/.local/bin/git": create(home / ".local" / "bin" / "git", program),
        "~/bin/git": create(home / "bin" / "git", program),
        "a folder on PATH": create(Path(cfg["path_folder"]) / "git", program),
        "bmad-loop's site-packages (.pth)": create(Path(cfg["site_packages"]) / "hostile.pth",
                                                   f"# {MARK}\n"),
        "bmad-loop's own code": append(cfg["package_file"]),
        "rename ~/.config (moves ~/.config/git)": lambda: os.rename(home / ".config",
                                                                  home / ".config-moved"),
        "rename the project's folder": lambda: os.rename(project, f"{project}-moved"),
        "rename the folder above the project": lambda: os.rename(
            project.parent, f"{project.parent}-moved"),
        "its own session log": append(log, "x" * 4096),
        "bmad-loop's private temp folder": create(git / "bmad-loop-tmp" / "attrs-x" /
                                                  ".gitattributes", f"* merge=union # {MARK}\n"),
        **servers(cfg, home),
    }


def servers(cfg, home):
    """Servers outside the box that would run a command or sign for the agent: tmux's (the one
    whose pane it runs in, named by $TMUX, and another of the user's), and whatever listens in the
    runtime folder or as the SSH agent. Each command would leave the mark in the home."""
    found = {f"socket: {label}": connect(path) for label, path in cfg.get("sockets", {}).items()}
    tmux_servers = dict(cfg.get("tmux", {}))
    if os.environ.get("TMUX"):  # set by tmux in its panes: "socket,pid,window"
        tmux_servers["the tmux server it runs in"] = os.environ["TMUX"].split(",")[0]
    for label, socket_path in tmux_servers.items():
        found[f"tmux: {label}"] = command("tmux", "-S", socket_path, "run-shell",
                                          f"echo {MARK} > {home}/tmux-{MARK}")
    return found


def main():
    cfg = json.loads(Path(sys.argv[1]).read_text())
    role = sys.argv[2]
    worktree = Path(os.environ.get("BMAD_LOOP_WORKTREE") or os.getcwd())
    results = {}
    for name, attempt in attempts(cfg, worktree).items():
        try:
            attempt()
            results[name] = "ok"
        except Exception as exc:  # noqa: BLE001 - every failure is an answer
            results[name] = f"refused: {exc}"
        print(f"{role}: {name}: {results[name]}")
    report_dir = Path(cfg["report_dir"])
    n = len(list(report_dir.glob(f"{role}-*.json"))) + 1
    (report_dir / f"{role}-{n}.json").write_text(json.dumps(
        {"boxed": os.environ.get("BMAD_LOOP_SANDBOX", ""), "results": results}))
    honest = worktree / cfg["honest_file"]
    if role == "agent":
        honest.parent.mkdir(parents=True, exist_ok=True)
        honest.write_text(cfg["honest_text"])
        return 0
    return 0 if honest.exists() and honest.read_text() == cfg["honest_text"] else 1


if __name__ == "__main__":
    sys.exit(main())
