"""Real git repositories shaped like the BMAD projects people keep, one per layout.

Each `BmadLayout` lists the files a project of that shape commits (board, story files, BMAD
configs), the files it leaves untracked (configs often are), and what bmad-loop must find: the
board (None: a v4 project has none) and, per actionable story, the story file (or where the
create phase will write it). `build_layout` makes the repository with the scripted agent as its
`[adapter] command`, committed on `main`. The shapes are invented from the layouts described in
issue 13; no project's files are copied.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from support import SprintRepo, init_repo, write

IMPL = "_bmad-output/implementation-artifacts"


def story_text(key: str, *, files=(), status: str = "ready-for-dev", v4_section: bool = False) -> str:
    """A story file with a footprint; `v4_section`: the status in a `## Status` section (v4)."""
    front = "---\n" + json.dumps({"title": key, "footprint": {"files": list(files)}}) + "\n---\n"
    status_part = f"## Status\n\n{status}\n" if v4_section else f"Status: {status}\n"
    return f"{front}# Story {key}\n\n{status_part}\n## Story\n\nAs a user I want {key}.\n"


def board_text(*lines: str, story_location: str | None = None) -> str:
    head = "# sprint board\n"
    if story_location is not None:
        head += f"story_location: {json.dumps(story_location)}\n"
    return head + "development_status:\n" + "".join(f"  {line}\n" for line in lines)


# The sprint every v6 layout shares: one done story, two to run (one without a story file).
V6_LINES = ("epic-1: in-progress", "1-1-scaffold: done", "1-2-login: ready-for-dev",
            "1-3-logout: backlog")


@dataclass
class BmadLayout:
    name: str
    committed: dict[str, str]
    board: str | None  # the board bmad-loop must find (repository-relative)
    story_files: dict[str, str]  # actionable key -> its story file (or where create writes it)
    found: dict[str, bool] = field(default_factory=dict)  # key -> has a file (default: True)
    untracked: dict[str, str] = field(default_factory=dict)
    warns: str = ""  # a fragment a validate warning must hold
    board_reason: str = ""  # a fragment of why the board was chosen

    def is_found(self, key: str) -> bool:
        return self.found.get(key, True)


def _v6(name: str, board: str, folder: str, *, story_names=None, story_location=None,
        config: dict[str, str] | None = None, untracked=None, warns="", reason="",
        with_logout: bool = False) -> BmadLayout:
    """A v6 layout: `board`, and story files named `story_names[key]` under `folder`."""
    names = story_names or {"1-1-scaffold": "1-1-scaffold.md", "1-2-login": "1-2-login.md"}
    files = {board: board_text(*V6_LINES, story_location=story_location)}
    for key, file_name in names.items():
        files[f"{folder}/{file_name}" if folder else file_name] = story_text(
            key, files=[f"src/{key}.py"], status="done" if key == "1-1-scaffold" else "ready-for-dev")
    files.update(config or {})
    files["src/__init__.py"] = ""
    where = {"1-2-login": f"{folder}/{names['1-2-login']}" if folder else names["1-2-login"],
             "1-3-logout": f"{folder}/1-3-logout.md" if folder else "1-3-logout.md"}
    found = {"1-3-logout": False}
    return BmadLayout(name, files, board, where, found, untracked or {}, warns, reason)


V6_CONFIG = ("project_name: shop\noutput_folder: '{project-root}/_bmad-output'\n"
             "implementation_artifacts: '{output_folder}/implementation-artifacts'\n")

LAYOUTS = [
    _v6("v6-default", f"{IMPL}/sprint-status.yaml", IMPL,
        config={"_bmad/bmm/config.yaml": V6_CONFIG}, reason="implementation_artifacts"),
    _v6("v6-config-untracked", f"{IMPL}/sprint-status.yaml", IMPL,
        untracked={"_bmad/bmm/config.yaml": V6_CONFIG}, reason="_bmad/bmm/config.yaml"),
    _v6("docs-implementation-artifacts", "docs/implementation-artifacts/sprint-status.yaml",
        "docs/implementation-artifacts", reason="known place"),
    _v6("docs-sprint-artifacts", "docs/sprint-artifacts/sprint-status.yaml",
        "docs/sprint-artifacts", reason="known place"),
    _v6("docs-stories", "docs/stories/sprint-status.yaml", "docs/stories", reason="known place"),
    _v6("docs-sprint-status", "docs/sprint-status.yaml", "docs/stories",
        story_location="docs/stories", reason="known place"),
    _v6("dot-bmad-config-sprint-artifacts", "planning/sprint/sprint-status.yaml", "planning/sprint",
        config={".bmad/bmm/config.yaml": "sprint_artifacts: '{project-root}/planning/sprint'\n"},
        reason=".bmad/bmm/config.yaml sprint_artifacts"),
    _v6("bmad-config-dev-story-location", "out/sprint-status.yaml", "out/stories",
        config={"bmad/bmm/config.yaml": "output_folder: '{project-root}/out'\n"
                                        "dev_story_location: '{output_folder}/stories'\n"},
        reason="bmad/bmm/config.yaml output_folder"),
    _v6("stories-subfolder", f"{IMPL}/sprint-status.yaml", IMPL,
        story_names={"1-1-scaffold": "stories/1-1-scaffold.md", "1-2-login": "stories/1-2-login.md"}),
    _v6("stories-epic-subfolders", f"{IMPL}/sprint-status.yaml", IMPL,
        story_names={"1-1-scaffold": "stories/epic-1/1-1-scaffold.md",
                     "1-2-login": "stories/epic-1/1-2-login.md"}),
    _v6("spec-names", f"{IMPL}/sprint-status.yaml", IMPL,
        story_names={"1-1-scaffold": "spec-1-1-scaffold.md", "1-2-login": "spec-1-2-login.md"}),
    _v6("story-dot-names", f"{IMPL}/sprint-status.yaml", IMPL,
        story_names={"1-1-scaffold": "story-1.1.md", "1-2-login": "story-1.2.md"}),
    _v6("story-location-absolute", "docs/sprint-status.yaml", "docs/stories",
        story_location="/home/someone/work/shop/docs/stories", warns="using docs/stories"),
    _v6("story-location-windows", "docs/sprint-status.yaml", "docs/stories",
        story_location="C:\\Users\\x\\proj\\docs\\stories", warns="using docs/stories"),
    _v6("story-location-outside", "docs/sprint-status.yaml", "docs/stories",
        story_location="../elsewhere/docs/stories", warns="using docs/stories"),
    _v6("story-location-placeholder", f"{IMPL}/sprint-status.yaml", IMPL,
        story_location="{story_location}", warns="names no folder"),
    _v6("story-location-nowhere", f"{IMPL}/sprint-status.yaml", IMPL,
        story_location="/srv/nowhere/at/all", warns="names no folder"),
]

V4_STORIES = {
    "1.1.scaffold": "Done",
    "1.2.login": "Approved",
    "1.3.profile": "Ready for Review",
    "1.10.export": "Approved",
    "2.1": "Draft",
    "2.2.search": "InProgress",
}
V4_ORDER = ["1.1.scaffold", "1.2.login", "1.3.profile", "1.10.export", "2.1", "2.2.search"]


def v4_layout(*, with_config: bool = True) -> BmadLayout:
    files = {"src/__init__.py": "", "docs/prd.md": "# PRD\n"}
    if with_config:
        files[".bmad-core/core-config.yaml"] = (
            "markdownExploder: true\nprd:\n  prdFile: docs/prd.md\n  prdSharded: false\n"
            "devStoryLocation: docs/stories\ndevDebugLog: .ai/debug-log.md\n")
    for n, (key, status) in enumerate(V4_STORIES.items()):
        # alternate the two forms v4 writes: a `Status:` line and a `## Status` section
        files[f"docs/stories/{key}.md"] = story_text(key, files=[f"src/s{key.replace('.', '_')}.py"],
                                                     status=status, v4_section=n % 2 == 1)
    actionable = {k: f"docs/stories/{k}.md" for k, s in V4_STORIES.items() if s == "Approved"}
    return BmadLayout("v4" if with_config else "v4-no-config", files, None, actionable,
                      board_reason="BMAD v4")


def build_layout(parent: Path, layout: BmadLayout, *, policy: str = "", script: dict | None = None,
                 name: str | None = None) -> SprintRepo:
    """The repository of `layout` under `parent`, committed on main, with the scripted agent."""
    root = parent / (name or layout.name)
    root.mkdir()
    init_repo(root)
    for rel, text in layout.committed.items():
        write(root / rel, text)
    write(root / ".gitignore", ".bmad-loop/\n")
    repo = SprintRepo(root=root, script_path=parent / f"{root.name}-script.json",
                      board_rel=layout.board or "")
    repo.write_script(script or {})
    repo.write_policy(policy)
    repo.commit_all("initial")
    for rel, text in layout.untracked.items():
        write(root / rel, text)
    return repo
