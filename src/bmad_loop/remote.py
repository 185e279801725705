"""Where the target lives and how it moves: the local repository, or a shared git remote.

In local mode (`[scm] remote` empty) the target is `refs/heads/<target>` of the project's own
repository and it advances by `update-ref <new> <old>` (compose.cas_advance).

In remote mode every consumer works in its own clone and the remote holds the truth:

- the target is read from a private mirror, `refs/bmad-loop/target/<target>`, refreshed by a
  fetch before every decision that depends on it. A private ref is never checked out, so the
  fetch cannot be refused, even in a human's checkout that has the target checked out;
- a story worker pushes its branch when the story is ready. Story branches belong to their
  story row (each is written by the one worker that holds the story's claim), so a re-queued
  story finished on another host may replace a branch a dead host pushed: `+` on story
  branches only;
- the lane fetches the story branch, composes and verifies in its own clone, then advances the
  remote target with `git push --force-with-lease=<target>:<expected old>`: a compare-and-swap
  on the remote. The candidate always descends from the old target (the lane checks), so this
  never rewrites history; a target that moved is reported stale and recomposed as usual.

A `remote` is either the name of a remote of the checkout (`origin`) or a URL / path. Every
host must reach the same repository by the same URL: the URL is the project's identity in the
rows, the lane lease and the queue names (see Project.key).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from .errors import ConfigError, GitError
from .gitcmd import Git, repo_lock

__all__ = ["Remote", "resolve_remote_url", "ensure_clone", "TARGET_MIRROR_NAMESPACE"]

TARGET_MIRROR_NAMESPACE = "refs/bmad-loop/target/"
_URL_LIKE = re.compile(r"^[a-z][a-z0-9+.-]*://|^[^/\s]+@[^:\s]+:|^/|^\.|.*\.git/?$", re.I)


def resolve_remote_url(remote: str, checkout: Path | None) -> str:
    """The URL `remote` stands for: itself when it looks like a URL or path, else the URL of
    the checkout's remote of that name."""
    remote = remote.strip()
    if _URL_LIKE.match(remote):
        if remote.startswith((".", "/")) and "://" not in remote:
            return str(Path(remote).expanduser().resolve())
        return remote
    if checkout is None:
        raise ConfigError(f"[scm] remote = \"{remote}\": a remote name needs a checkout "
                          "(--project); give the URL instead")
    proc = Git(checkout).run("remote", "get-url", remote, check=False)
    if proc.returncode != 0:
        raise ConfigError(f"[scm] remote = \"{remote}\": {checkout} has no remote of that name")
    url = proc.stdout.strip()
    if url.startswith((".", "/")) and "://" not in url:
        base = Path(url) if url.startswith("/") else (checkout / url)
        return str(base.resolve())
    return url


@dataclass(frozen=True)
class Remote:
    url: str

    # ------------------------------------------------------------------ the target
    @staticmethod
    def target_ref(target: str) -> str:
        return f"{TARGET_MIRROR_NAMESPACE}{target}"

    def fetch_target(self, git: Git, target: str) -> str:
        """Refresh the mirror of the remote target; its sha."""
        ref = self.target_ref(target)
        with repo_lock(git):
            proc = git.run("fetch", "--quiet", "--no-tags", self.url,
                           f"+refs/heads/{target}:{ref}", check=False)
        if proc.returncode != 0:
            raise GitError(f"cannot fetch {target} from {self.url}: {proc.stderr.strip()}",
                           returncode=proc.returncode, stderr=proc.stderr)
        sha = git.rev(ref)
        if sha is None:
            raise GitError(f"{self.url} has no branch {target}")
        return sha

    def push_target(self, git: Git, target: str, new: str, old: str) -> bool:
        """Compare-and-swap the remote target from `old` to `new`. False: it is no longer `old`."""
        if not git.is_ancestor(old, new):
            raise GitError(f"refusing to push {new} to {target}: it does not descend from {old}")
        ref = self.target_ref(target)
        with repo_lock(git):
            proc = git.run("push", "--porcelain", "--no-verify",
                           f"--force-with-lease=refs/heads/{target}:{old}", self.url,
                           f"{new}:refs/heads/{target}", check=False)
            if proc.returncode == 0:
                git.run("update-ref", ref, new)
                return True
        current = self.fetch_target(git, target)
        if current == new:
            return True  # an earlier push of ours landed and its answer was lost
        if current != old:
            return False
        raise GitError(f"cannot push {target} to {self.url}: {(proc.stderr or proc.stdout).strip()}",
                       returncode=proc.returncode, stderr=proc.stderr)

    # ------------------------------------------------------------------ story branches
    def publish_branch(self, git: Git, branch: str, sha: str) -> None:
        """Push a story branch (owned by its story row, so `+`: see the module docstring)."""
        proc = git.run("push", "--quiet", "--no-verify", self.url, f"+{sha}:refs/heads/{branch}",
                       check=False)
        if proc.returncode != 0:
            raise GitError(f"cannot push {branch} to {self.url}: {proc.stderr.strip()}",
                           returncode=proc.returncode, stderr=proc.stderr)

    def fetch_branch(self, git: Git, branch: str) -> str | None:
        """Fetch a story branch's commits into a private ref; its sha, None when absent."""
        ref = f"refs/bmad-loop/fetched/{branch}"
        with repo_lock(git):
            proc = git.run("fetch", "--quiet", "--no-tags", self.url,
                           f"+refs/heads/{branch}:{ref}", check=False)
        if proc.returncode != 0:
            if "couldn't find remote ref" in (proc.stderr or "").lower():
                return None
            raise GitError(f"cannot fetch {branch} from {self.url}: {proc.stderr.strip()}",
                           returncode=proc.returncode, stderr=proc.stderr)
        return git.rev(ref)

    def delete_branch(self, git: Git, branch: str) -> None:
        """Delete a story branch on the remote (gone already is fine)."""
        git.run("push", "--quiet", "--no-verify", self.url, f":refs/heads/{branch}", check=False)
        git.run("update-ref", "-d", f"refs/bmad-loop/fetched/{branch}", check=False)

    def branches(self, git: Git, namespace: str) -> dict[str, str]:
        """Branches under `namespace` on the remote: name → sha."""
        out = git.out("ls-remote", "--heads", self.url, f"refs/heads/{namespace}*")
        found = {}
        for line in out.splitlines():
            sha, _, ref = line.partition("\t")
            if ref.startswith("refs/heads/"):
                found[ref[len("refs/heads/"):]] = sha
        return found


def ensure_clone(url: str, directory: Path) -> Path:
    """Create a clone of `url` at `directory`, or check that the one there is a clone of it.

    The clone's own checkout is detached: bmad-loop never needs a branch checked out there, and
    a checked-out branch would be one that a fetch may not update.
    """
    directory = Path(directory).expanduser().resolve()
    if (directory / ".git").exists():
        git = Git(directory)
        urls = git.run("remote", "-v", check=False).stdout.split()
        if url not in urls:
            raise ConfigError(f"--clone {directory}: a git repository that is not a clone of {url}")
        return directory
    if directory.exists() and any(directory.iterdir()):
        raise ConfigError(f"--clone {directory}: exists, is not empty and is not a git clone")
    directory.parent.mkdir(parents=True, exist_ok=True)
    proc = Git(directory.parent).run("clone", "--quiet", "--no-checkout", url, directory, check=False)
    if proc.returncode != 0:
        raise ConfigError(f"--clone {directory}: cannot clone {url}: {proc.stderr.strip()}")
    git = Git(directory)
    head = git.rev("HEAD")
    if head is not None:
        git.run("checkout", "--quiet", "--detach", head)
    return directory
