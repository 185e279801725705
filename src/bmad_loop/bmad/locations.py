"""Where a BMAD project keeps its sprint board, in every layout BMAD installs have used.

The board is found in this order (the first step that finds something decides):

1. the policy's `[stories] sprint_status` (relative to the project root, `{project-root}`
   allowed); it may lie outside the repository (then the lane cannot edit it);
2. a BMAD config, read from the working copy (it is often untracked): BMAD v6.11's layered
   `_bmad/config.toml` (then `config.user.toml`, `custom/config.toml`,
   `custom/config.user.toml`, each winning over the one before; its `[core]` and
   `[modules.bmm]` keys), then the module configs `_bmad/bmm/config.yaml` (v6),
   `.bmad/bmm/config.yaml` and `bmad/bmm/config.yaml` (older v6 installs). Each folder key, most specific first — `implementation_artifacts`,
   `sprint_artifacts`, `dev_story_location`, `story_location`, `output_folder` — names a
   folder that may hold `sprint-status.yaml`; `{project-root}` and `{<other key>}` (e.g.
   `{output_folder}`) are substituted;
3. the known places, for a project whose config is not committed: `KNOWN_BOARDS`;
4. a BMAD v4 project: no board, `.bmad-core/core-config.yaml` (`devStoryLocation`, default
   `docs/stories`) or `E.S.*.md` story files in `docs/stories` (see `v4`).

A board "is there" when the committed target holds it or the working copy does (an uncommitted
board is then refused by name, not overlooked). Two different boards in one step are an error
listing them; none anywhere is an error listing every place looked at.
"""

from __future__ import annotations

import os
import posixpath
import re
import tomllib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from ..errors import ConfigError
from ..git.trees.committed import TreeView

__all__ = ["BoardSource", "KNOWN_BOARDS", "BMM_CONFIGS", "TOML_LAYERS", "V4_CONFIG", "find_board",
           "read_config", "repo_relative", "config_story_folder", "implementation_artifacts"]

BOARD_NAME = "sprint-status.yaml"
KNOWN_BOARDS = (
    "_bmad-output/implementation-artifacts/sprint-status.yaml",
    "docs/implementation-artifacts/sprint-status.yaml",
    "docs/sprint-artifacts/sprint-status.yaml",
    "docs/stories/sprint-status.yaml",
    "docs/sprint-status.yaml",
)
BMM_CONFIGS = ("_bmad/bmm/config.yaml", ".bmad/bmm/config.yaml", "bmad/bmm/config.yaml")
# BMAD v6.11's layered config, base first: each later file wins over the ones before it.
TOML_LAYERS = ("_bmad/config.toml", "_bmad/config.user.toml", "_bmad/custom/config.toml",
               "_bmad/custom/config.user.toml")
V4_CONFIG = ".bmad-core/core-config.yaml"
V4_STORY_DIR = "docs/stories"
# Config keys naming a folder that may hold the board, most specific first.
BOARD_FOLDER_KEYS = ("implementation_artifacts", "sprint_artifacts", "dev_story_location",
                     "story_location", "output_folder")
# Config keys naming the story folder (older installs keep stories apart from the board).
STORY_FOLDER_KEYS = ("dev_story_location", "story_location")
_V4_STORY_RE = re.compile(r"^\d+\.\d+[a-z]?(\..+)?\.md$")
_PLACEHOLDER_RE = re.compile(r"\{([A-Za-z0-9_-]+)\}")


@dataclass(frozen=True)
class BoardSource:
    """Where the board is and why. `rel` is its repository-relative path; None for a board
    outside the repository and for a v4 project (which has no board: `path` is then its
    story folder)."""

    path: Path
    rel: str | None
    reason: str
    format: str = "v6"  # "v6": a sprint-status.yaml; "v4": synthesised from story files
    config: str | None = None  # the config file that named the board or story folder
    story_folder: str | None = None  # repo-relative story folder the config names, if any


def repo_relative(value: str, root: Path) -> str | None:
    """`value` (relative to `root`, or absolute) as a normalised repository-relative POSIX
    path; None when it lies outside `root`."""
    path = value if os.path.isabs(value) else os.path.join(root, value)
    rel = os.path.relpath(os.path.normpath(path), root)
    if rel == os.pardir or rel.startswith(os.pardir + os.sep) or os.path.isabs(rel):
        return None
    rel = Path(rel).as_posix()
    return "" if rel == "." else rel


def read_config(path: Path) -> dict[str, Any]:
    """A YAML config file as a mapping ({} for an empty or non-mapping one)."""
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError:
        raise ConfigError(f"{path}: invalid YAML") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: cannot read the BMAD config: {exc}") from None
    return data if isinstance(data, dict) else {}


def read_layered_config(config_root: Path) -> dict[str, Any] | None:
    """BMAD v6.11's layered TOML config as one flat mapping of its `[core]` keys overlaid with
    its `[modules.bmm]` keys (the layers merged, later files winning); None without one."""
    core: dict = {}
    bmm: dict = {}
    found = False
    for name in TOML_LAYERS:
        path = config_root / name
        if not path.is_file():
            continue
        try:
            data = tomllib.loads(path.read_text(encoding="utf-8"))
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"{path}: invalid TOML: {exc}") from None
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigError(f"{path}: cannot read the BMAD config: {exc}") from None
        found = True
        core.update(_table(data.get("core")))
        bmm.update(_table(_table(data.get("modules")).get("bmm")))
    return {**core, **bmm} if found else None


def _table(value: object) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _configs(config_root: Path) -> Iterator[tuple[str, dict[str, Any]]]:
    """(name, config mapping) of each BMAD config present, in the order they are asked."""
    layered = read_layered_config(config_root)
    if layered is not None:
        yield TOML_LAYERS[0], layered
    for name in BMM_CONFIGS:
        path = config_root / name
        if path.is_file():
            yield name, read_config(path)


def implementation_artifacts(root: Path, config_root: Path | None = None) -> str | None:
    """The repository-relative folder a BMAD config names `implementation_artifacts` (where
    BMAD keeps its deferred-work ledger), or None."""
    for _name, config in _configs(Path(config_root or root)):
        for _key, rel in _config_folders(root, config, ("implementation_artifacts",)):
            return rel
    return None


def _expand(value: str, root: Path, config: dict[str, Any]) -> str:
    """`{project-root}` and `{<key>}` of another string key of the same config, substituted."""
    for _ in range(5):  # keys may name each other: a few rounds, never a loop
        def sub(m: re.Match[str]) -> str:
            name = m.group(1)
            if name == "project-root":
                return str(root)
            other = config.get(name)
            return other if isinstance(other, str) else m.group(0)
        expanded = _PLACEHOLDER_RE.sub(sub, value)
        if expanded == value:
            break
        value = expanded
    return value


def _config_folders(root: Path, config: dict[str, Any],
                    keys: Iterable[str]) -> list[tuple[str, str]]:
    """(key, repo-relative folder) for each of `keys` the config sets to a folder in the
    repository."""
    found = []
    for key in keys:
        value = config.get(key)
        if not isinstance(value, str) or not value.strip():
            continue
        expanded = _expand(value.strip(), root, config)
        if "{" in expanded:
            continue
        rel = repo_relative(expanded, root)
        if rel is not None:
            found.append((key, rel))
    return found


def config_story_folder(root: Path, config_root: Path) -> tuple[str, str] | None:
    """(config file, story folder) from the first BMAD config naming a story folder."""
    for name, config in _configs(config_root):
        for _key, rel in _config_folders(root, config, STORY_FOLDER_KEYS):
            return name, rel
    return None


def _exists(rel: str, tree: TreeView, root: Path) -> bool:
    return tree.is_file(rel) or (root / rel).is_file()


def _one(found: list[BoardSource], root: Path) -> BoardSource | None:
    distinct = list({s.rel: s for s in found}.values())
    if len(distinct) > 1:
        listed = ", ".join(f"{s.rel} ({s.reason})" for s in distinct)
        raise ConfigError(f"{root}: several sprint boards: {listed}; choose one with "
                          "[stories] sprint_status in .bmad-loop/policy.toml")
    return distinct[0] if distinct else None


def find_board(root: Path, tree: TreeView, sprint_status: str = "", config_root: Path | None = None,
               named: str = "policy [stories] sprint_status") -> BoardSource:
    """Where the board is (see the module docstring). `tree` is the committed target
    (`committed.CommittedTree`); configs are read under `config_root` (default `root`);
    `named` says where `sprint_status` came from (the policy key or its variable)."""
    root = Path(root)
    config_root = Path(config_root or root)
    if sprint_status.strip():
        value = sprint_status.strip().replace("{project-root}", str(root))
        rel = repo_relative(value, root)
        path = root / rel if rel is not None else Path(value)
        return BoardSource(path=path, rel=rel, reason=named)
    looked: list[str] = []
    found: list[BoardSource] = []
    for name, config in _configs(config_root):
        for key, folder in _config_folders(root, config, BOARD_FOLDER_KEYS):
            rel = posixpath.join(folder, BOARD_NAME)
            looked.append(rel)
            if _exists(rel, tree, root):
                found.append(BoardSource(path=root / rel, rel=rel, reason=f"{name} {key}",
                                         config=name))
        if found:
            break  # the first config that names an existing board decides
    source = _one(found, root)
    if source is not None:
        return source
    found = [BoardSource(path=root / rel, rel=rel, reason="known place")
             for rel in KNOWN_BOARDS if _exists(rel, tree, root)]
    looked.extend(rel for rel in KNOWN_BOARDS if rel not in looked)
    source = _one(found, root)
    if source is not None:
        return source
    v4 = _v4_source(root, tree, config_root)
    if v4 is not None:
        return v4
    raise ConfigError(f"{root}: no sprint board found (looked at {', '.join(looked)}, and for "
                      f"a BMAD v4 {V4_CONFIG}); set [stories] sprint_status in "
                      ".bmad-loop/policy.toml")


def _v4_source(root: Path, tree: TreeView, config_root: Path) -> BoardSource | None:
    config_path = config_root / V4_CONFIG
    if config_path.is_file():
        config = read_config(config_path)
        value = config.get("devStoryLocation")
        folder = repo_relative(value.strip(), root) if isinstance(value, str) and value.strip() else None
        folder = V4_STORY_DIR if folder is None else folder
        return BoardSource(path=root / folder, rel=None, format="v4", config=V4_CONFIG,
                           reason=f"BMAD v4 {V4_CONFIG} devStoryLocation", story_folder=folder)
    if any(_V4_STORY_RE.match(name) for name in tree.names(V4_STORY_DIR)):
        return BoardSource(path=root / V4_STORY_DIR, rel=None, format="v4",
                           reason=f"BMAD v4 story files in {V4_STORY_DIR}",
                           story_folder=V4_STORY_DIR)
    return None
