"""The target on a shared git remote, reached from this process's own clone.

- The target is read from a private mirror, `refs/bmad-loop/target/<target>`, refreshed by a
  fetch before every decision that depends on it. A private ref is never checked out, so the
  fetch cannot be refused, even in a human's checkout that has the target checked out.
- A story worker pushes its branch when the story is ready. Story branches belong to their
  story row (each is written by the one worker that holds the story's claim), so a re-queued
  story finished on another host may replace a branch a dead host pushed: `+` on story
  branches only.
- The lane fetches the story branch, composes and verifies in its own clone, then advances the
  remote target with `git push --force-with-lease=<target>:<expected old>`: a compare-and-swap
  on the remote. The candidate always descends from the old target (checked first), so this
  never rewrites history; a target that moved is reported stale and recomposed as usual.
"""

from __future__ import annotations

from pathlib import Path

from ...errors import GitError
from ..locks import repo_lock
from ..runner import NO_AUTO_MAINTENANCE, Git
from .base import Target

__all__ = ["RemoteTarget", "TARGET_MIRROR_NAMESPACE", "FETCHED_NAMESPACE"]

TARGET_MIRROR_NAMESPACE = "refs/bmad-loop/target/"
FETCHED_NAMESPACE = "refs/bmad-loop/fetched/"


class RemoteTarget(Target):
    """The target branch `branch` of the shared remote at `url`, seen from `git`'s clone."""

    # A landed story's worktree is on its story host; that host sweeps it.
    lane_removes_story_worktrees = False
    publishes_stories = True

    def __init__(self, git: Git, branch: str, url: str) -> None:
        super().__init__(git, branch)
        self.url = url

    # ------------------------------------------------------------------ the target
    @property
    def ref(self) -> str:
        return f"{TARGET_MIRROR_NAMESPACE}{self.branch}"

    def sha(self, *, fetch: bool = True) -> str | None:
        if not fetch:
            return self.git.rev(self.ref)
        with repo_lock(self.git):
            proc = self.git.run(*NO_AUTO_MAINTENANCE, "fetch", "--quiet", "--no-tags", self.url,
                                f"+refs/heads/{self.branch}:{self.ref}", check=False)
        if proc.returncode != 0:
            raise GitError(f"cannot fetch {self.branch} from {self.url}: {proc.stderr.strip()}",
                           returncode=proc.returncode, stderr=proc.stderr)
        sha = self.git.rev(self.ref)
        if sha is None:
            raise GitError(f"{self.url} has no branch {self.branch}")
        return sha

    def advance(self, new: str, old: str) -> bool:
        git = self.git
        if not git.is_ancestor(old, new):
            raise GitError(f"refusing to push {new} to {self.branch}: it does not descend from {old}")
        with repo_lock(git):
            proc = git.run("push", "--porcelain", "--no-verify",
                           f"--force-with-lease=refs/heads/{self.branch}:{old}", self.url,
                           f"{new}:refs/heads/{self.branch}", check=False)
            if proc.returncode == 0:
                git.run("update-ref", self.ref, new)
                return True
        current = self.sha()
        if current == new:
            return True  # an earlier push of ours landed and its answer was lost
        if current != old:
            return False
        raise GitError(f"cannot push {self.branch} to {self.url}: "
                       f"{(proc.stderr or proc.stdout).strip()}",
                       returncode=proc.returncode, stderr=proc.stderr)

    def story_source(self, worktree: Path) -> Path:
        # The checkout that planned the run is on another host.
        return worktree

    # ------------------------------------------------------------------ story branches
    def story_head(self, branch: str) -> str | None:
        ref = f"{FETCHED_NAMESPACE}{branch}"
        with repo_lock(self.git):
            proc = self.git.run(*NO_AUTO_MAINTENANCE, "fetch", "--quiet", "--no-tags", self.url,
                                f"+refs/heads/{branch}:{ref}", check=False)
        if proc.returncode != 0:
            if "couldn't find remote ref" in (proc.stderr or "").lower():
                return None
            raise GitError(f"cannot fetch {branch} from {self.url}: {proc.stderr.strip()}",
                           returncode=proc.returncode, stderr=proc.stderr)
        return self.git.rev(ref)

    def publish_story(self, branch: str, sha: str) -> bool:
        proc = self.git.run("push", "--quiet", "--no-verify", self.url,
                            f"+{sha}:refs/heads/{branch}", check=False)
        if proc.returncode != 0:
            raise GitError(f"cannot push {branch} to {self.url}: {proc.stderr.strip()}",
                           returncode=proc.returncode, stderr=proc.stderr)
        return True

    def delete_story_branch(self, branch: str) -> None:
        self.git.run("push", "--quiet", "--no-verify", self.url, f":refs/heads/{branch}", check=False)
        self.git.run("update-ref", "-d", f"{FETCHED_NAMESPACE}{branch}", check=False)

    def foreign_story_branches(self, namespace: str) -> dict[str, str]:
        out = self.git.out("ls-remote", "--heads", self.url, f"refs/heads/{namespace}*")
        found: dict[str, str] = {}
        for line in out.splitlines():
            sha, _, ref = line.partition("\t")
            if ref.startswith("refs/heads/"):
                found[ref[len("refs/heads/"):]] = sha
        return found

    @property
    def location(self) -> str:
        return self.url
