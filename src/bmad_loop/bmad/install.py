"""BMAD as the project has it installed: skills, the older workflow folders, v4, or nothing.

BMAD v6.2 and later install its workflows as agent skills, one folder per skill holding a
`SKILL.md`, under the folder each agent CLI reads (`.claude/skills/` for Claude Code,
`.agents/skills/` for Codex, Gemini CLI and others). v6.0 and v6.1 installs keep them as
workflow folders under `_bmad/bmm/workflows/4-implementation/` (older alphas: `bmad/` or
`.bmad/`); v4 projects have `.bmad-core/`. The prompt names what is there, so an agent is never
sent to a folder that does not exist.

Installs are often untracked (teams commit the sprint's documents, not the tool), and a git
worktree holds only tracked files: `bmad_seeds` lists the BMAD folders and files the checkout
has but the target's tree does not, so each worktree gets a copy (never committed).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Mapping

from ..states import Phase

if TYPE_CHECKING:
    from ..git.runner import Git

__all__ = ["BmadInstall", "SKILL_ROOTS", "WORKFLOW_ROOTS", "detect_bmad", "bmad_seed_candidates",
           "bmad_seeds"]

# Where agent CLIs look for project skills (BMAD's installer writes to these).
SKILL_ROOTS = (".claude/skills", ".agents/skills", ".agent/skills", ".gemini/skills")
# Install folders of BMAD v6 releases and alphas, newest name first.
INSTALL_ROOTS = ("_bmad", ".bmad", "bmad")
WORKFLOW_ROOTS = tuple(f"{root}/bmm/workflows/4-implementation" for root in INSTALL_ROOTS)
V4_CORE = ".bmad-core"

# The skill each phase runs, most specific first: `bmad-dev-story` is the story-by-story
# implementation workflow; releases after v6.8 ship `bmad-build` as its successor.
PHASE_SKILLS: Mapping[str, tuple[str, ...]] = MappingProxyType({
    Phase.CREATE: ("bmad-create-story",),
    Phase.DEV: ("bmad-dev-story", "bmad-build"),
    Phase.REVIEW: ("bmad-code-review",),
    Phase.FIX: ("bmad-dev-story", "bmad-build"),
    Phase.REPAIR: ("bmad-dev-story", "bmad-build"),
})
PHASE_WORKFLOWS: Mapping[str, str] = MappingProxyType({
    Phase.CREATE: "create-story", Phase.DEV: "dev-story",
    Phase.REVIEW: "code-review", Phase.FIX: "dev-story", Phase.REPAIR: "dev-story",
})


@dataclass(frozen=True)
class BmadInstall:
    """What the project has: `kind` is "skills", "workflows", "v4" or "none"."""

    kind: str
    skills: Mapping[str, str] = field(default_factory=dict)  # phase -> "<root>/<skill>"
    workflows: Mapping[str, str] = field(default_factory=dict)  # phase -> workflow folder

    def skill_name(self, phase: str) -> str | None:
        path = self.skills.get(phase)
        return path.rsplit("/", 1)[-1] if path else None

    def guidance(self, phase: str) -> str:
        """How this project's BMAD runs `phase`, for the prompt ("" when it has no BMAD)."""
        skill = self.skill_name(phase)
        if skill:
            return (f"This project has BMAD installed as agent skills: run the `{skill}` skill "
                    f"(`{self.skills[phase]}/SKILL.md`) for this story.")
        folder = self.workflows.get(phase)
        if folder:
            return (f"This project has BMAD installed as workflow folders: follow the workflow in "
                    f"`{folder}/` (its `workflow.md`, or its `workflow.yaml` with the "
                    "`instructions.xml` beside it) for this story.")
        if self.kind == "v4":
            return ("This project uses BMAD v4 (`.bmad-core/`): follow the dev agent's "
                    "instructions in `.bmad-core/agents/dev.md` for this story.")
        return ""


def _skill_dirs(root: Path) -> dict[str, str]:
    """Skill name -> its folder (repository-relative), the first skill root that has it."""
    found: dict[str, str] = {}
    for skill_root in SKILL_ROOTS:
        folder = root / skill_root
        if not folder.is_dir():
            continue
        for entry in sorted(folder.iterdir()):
            if entry.name.startswith("bmad-") and (entry / "SKILL.md").is_file():
                found.setdefault(entry.name, f"{skill_root}/{entry.name}")
    return found


def detect_bmad(root: Path) -> BmadInstall:
    """What the working copy at `root` has installed (the install is often untracked, so the
    working copy, not the target's tree, is where to look)."""
    root = Path(root)
    dirs = _skill_dirs(root)
    skills = {}
    for phase, names in PHASE_SKILLS.items():
        for name in names:
            if name in dirs:
                skills[phase] = dirs[name]
                break
    if skills:
        return BmadInstall("skills", skills=MappingProxyType(skills))
    for workflow_root in WORKFLOW_ROOTS:
        folder = root / workflow_root
        if not folder.is_dir():
            continue
        workflows = {phase: f"{workflow_root}/{name}" for phase, name in PHASE_WORKFLOWS.items()
                     if (folder / name).is_dir()}
        if workflows:
            return BmadInstall("workflows", workflows=MappingProxyType(workflows))
    if (root / V4_CORE).is_dir():
        return BmadInstall("v4")
    return BmadInstall("none")


def bmad_seed_candidates(root: Path) -> list[str]:
    """BMAD folders of the working copy an agent may need: install folders, `.bmad-core/` and
    every `bmad-*` skill folder (repository-relative; only those that exist)."""
    root = Path(root)
    found = [name for name in (*INSTALL_ROOTS, V4_CORE) if (root / name).is_dir()]
    for skill_root in SKILL_ROOTS:
        folder = root / skill_root
        if folder.is_dir():
            found += [f"{skill_root}/{entry.name}" for entry in sorted(folder.iterdir())
                      if entry.name.startswith("bmad-") and entry.is_dir()]
    return found


def bmad_seeds(git: Git, root: Path) -> list[str]:
    """The untracked part of the BMAD folders `bmad_seed_candidates` finds: what a worktree
    (tracked files only) would lack. A wholly untracked folder is one entry; in a partly
    tracked one, each untracked file or folder is. Ignored files count: `_bmad/` is often in
    `.gitignore`, and the agent needs it all the same."""
    candidates = bmad_seed_candidates(root)
    if not candidates:
        return []
    # One git process: untracked (ignored included) paths under the candidates, untracked
    # folders collapsed to one entry.
    out = git.run("ls-files", "-z", "--others", "--directory", "--", *candidates, cwd=root).stdout
    return sorted(p.rstrip("/") for p in out.split("\0") if p)
