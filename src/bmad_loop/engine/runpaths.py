"""Where a run keeps things (its `Layout`): branch names, ref namespaces, worktree folders,
logs, prompts, evidence.

One module so the naming scheme that `cleanup` relies on is written down exactly once.
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["BRANCH_NAMESPACE", "CANDIDATE_REF_NAMESPACE", "Layout"]

BRANCH_NAMESPACE = "bmad-loop/"  # refs/heads/bmad-loop/<run>/<story>
CANDIDATE_REF_NAMESPACE = "refs/bmad-loop/candidates/"  # …/<run>/<story>/<attempt>
RUN_BRANCH_LEAF = "run"  # branch_per = "run": bmad-loop/<run>/run


class Layout:
    def __init__(self, state_dir: Path, run_id: str):
        self.state_dir = state_dir
        self.run_id = run_id

    def story_branch(self, story_key: str, branch_per: str = "story") -> str:
        leaf = RUN_BRANCH_LEAF if branch_per == "run" else story_key
        return f"{BRANCH_NAMESPACE}{self.run_id}/{leaf}"

    def story_worktree(self, story_key: str, branch_per: str = "story") -> Path:
        leaf = RUN_BRANCH_LEAF if branch_per == "run" else story_key
        return self.state_dir / "worktrees" / self.run_id / leaf

    def candidate_ref(self, story_key: str, attempt: int) -> str:
        return f"{CANDIDATE_REF_NAMESPACE}{self.run_id}/{story_key}/{attempt}"

    def candidate_worktree(self, story_key: str, attempt: int) -> Path:
        return self.state_dir / "candidates" / self.run_id / f"{story_key}-{attempt}"

    def target_worktree(self) -> Path:
        """The detached worktree the lane checks the target's own commit in (verification/targetcheck.py)."""
        return self.state_dir / "candidates" / self.run_id / "target"

    def target_log(self, target_sha: str) -> Path:
        return self.state_dir / "logs" / self.run_id / "target" / f"verify-{target_sha[:12]}.log"

    def target_scratch(self) -> Path:
        return self.state_dir / "scratch" / self.run_id / "target"

    def repair_evidence(self, story_key: str, number: int) -> Path:
        """What a repair session is told (the lane's request, the stories that landed): JSON."""
        return self.state_dir / "evidence" / self.run_id / f"{story_key}-repair-{number}.json"

    def evidence(self, story_key: str, attempt: int) -> Path:
        return self.state_dir / "evidence" / self.run_id / f"{story_key}-{attempt}.json"

    def log(self, story_key: str, phase: str, attempt: int) -> Path:
        return self.state_dir / "logs" / self.run_id / story_key / f"{phase}-{attempt}.log"

    def verify_log(self, story_key: str, label: str) -> Path:
        return self.state_dir / "logs" / self.run_id / story_key / f"verify-{label}.log"

    def prompt(self, story_key: str, phase: str, attempt: int) -> Path:
        return self.state_dir / "prompts" / self.run_id / story_key / f"{phase}-{attempt}.md"

    def scratch(self, story_key: str) -> Path:
        """Per-story scratch state outside the worktree (BMAD_LOOP_STATE_DIR, TMPDIR)."""
        return self.state_dir / "scratch" / self.run_id / story_key
