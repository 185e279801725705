"""The command adapter: what one agent session of a story runs, and what its output says.

Any CLI can be an agent. Its argv template holds `{placeholders}` (see `PLACEHOLDERS`), it runs
with no shell, cwd = the story's worktree, stdin = /dev/null, the `BMAD_LOOP_*` environment of the
contract, and stdout+stderr appended to the session log. Exit 0 = success (review: approved).

The session itself — spawned, logged, timed, stopped, its whole process tree ended — is
`process.supervise`'s; this module turns a phase of a story into its argv and environment and
reads back its output and its review verdict.
"""

from __future__ import annotations

import os
import re
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Mapping, Sequence

from ..errors import ConfigError
from ..states import AGENT_PHASES
from .process import AgentResult

__all__ = [
    "PLACEHOLDERS",
    "PHASES",
    "OUTPUT_TAIL_BYTES",
    "VERDICT_PREFIX",
    "AgentCall",
    "AgentResult",
    "render_argv",
    "agent_env",
    "check_binary",
    "session_output",
    "read_tail",
    "read_verdict",
    "review_approved",
]

PLACEHOLDERS = ("phase", "story_key", "story_file", "prompt_file", "worktree", "run_id", "attempt", "model", "tier")
PHASES = AGENT_PHASES  # the phases an agent runs: dev, review, fix

# What `session_output` reads back at most: enough for a review's notes and its verdict line,
# small whatever the agent printed (its whole output is in the log file).
OUTPUT_TAIL_BYTES = 256 * 1024
VERDICT_PREFIX = "BMAD-LOOP-VERDICT:"  # see read_verdict

_PLACEHOLDER = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)\}")


@dataclass(frozen=True)
class AgentCall:
    """Everything one agent session is told about its work."""

    phase: str  # dev | review | fix
    story_key: str
    story_file: str
    prompt_file: str
    worktree: str
    run_id: str
    attempt: int  # 1 on the first try
    base_sha: str
    model: str = ""
    tier: str = ""
    # [adapter.env] merged with the phase's env and the lane-sandbox variables, by the caller.
    extra_env: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))

    def placeholder_values(self) -> dict[str, str]:
        return {
            "phase": self.phase,
            "story_key": self.story_key,
            "story_file": self.story_file,
            "prompt_file": self.prompt_file,
            "worktree": self.worktree,
            "run_id": self.run_id,
            "attempt": str(self.attempt),
            "model": self.model,
            "tier": self.tier,
        }


# --------------------------------------------------------------------------- argv and environment


def render_argv(template: Sequence[str], call: AgentCall) -> list[str]:
    """Substitute `{placeholders}` in each element of `template`.

    An element that is exactly one placeholder whose value is empty is dropped (`{model}` with no
    model). Text that is not `{identifier}` (JSON, `{}`) is left alone. An unknown placeholder is a
    ConfigError naming it.
    """
    values = call.placeholder_values()
    argv: list[str] = []
    for element in template:
        element = str(element)
        for name in _PLACEHOLDER.findall(element):
            if name not in values:
                raise ConfigError(f"[adapter] command: unknown placeholder {{{name}}}"
                                  f" (known: {', '.join('{' + p + '}' for p in PLACEHOLDERS)})")
        whole = _PLACEHOLDER.fullmatch(element)
        if whole and values[whole.group(1)] == "":
            continue
        argv.append(_PLACEHOLDER.sub(lambda m: values[m.group(1)], element))
    return argv


def agent_env(call: AgentCall, base_env: Mapping[str, str]) -> dict[str, str]:
    """The agent's environment: `base_env`, then `call.extra_env`, then the contract variables.

    The `BMAD_LOOP_*` variables of the contract come last so that no policy or lane variable can
    make an agent believe it works on another story.
    """
    env = {str(k): str(v) for k, v in base_env.items()}
    env.update({str(k): str(v) for k, v in call.extra_env.items()})
    env.update({
        # The agent runs in its worktree; a PWD inherited from bmad-loop would name another
        # folder, and CLIs that trust PWD over getcwd() (opencode) would work there.
        "PWD": call.worktree,
        "BMAD_LOOP_RUN_ID": call.run_id,
        "BMAD_LOOP_STORY_KEY": call.story_key,
        "BMAD_LOOP_PHASE": call.phase,
        "BMAD_LOOP_WORKTREE": call.worktree,
        "BMAD_LOOP_STORY_FILE": call.story_file,
        "BMAD_LOOP_PROMPT_FILE": call.prompt_file,
        "BMAD_LOOP_ATTEMPT": str(call.attempt),
        "BMAD_LOOP_BASE_SHA": call.base_sha,
        "BMAD_LOOP_MODEL": call.model,
        "BMAD_LOOP_TIER": call.tier,
    })
    return env


def check_binary(argv0: str, source: str, *, path: str | None = None, cwd: str | os.PathLike | None = None) -> str:
    """Resolve the agent binary like exec would, or raise a ConfigError naming it and `source`.

    A name without a slash is looked up on `path` (default: this process's PATH); one with a slash
    must be an executable file (relative to `cwd` when given). Returns the resolved path.
    """
    if not argv0:
        raise ConfigError(f"{source}: the agent command is empty")
    if os.sep in argv0 or (os.altsep and os.altsep in argv0):
        candidate = Path(argv0)
        if not candidate.is_absolute() and cwd is not None:
            candidate = Path(cwd) / candidate
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return str(candidate.absolute())
        raise ConfigError(f"{source}: agent binary '{argv0}' not found or not executable")
    found = shutil.which(argv0, path=path)
    if found is None:
        raise ConfigError(f"{source}: agent binary '{argv0}' not found on PATH")
    return found


# --------------------------------------------------------------------------- running a session


def session_output(log_path: Path, result: AgentResult, *, max_chars: int | None = None,
                   max_bytes: int = OUTPUT_TAIL_BYTES) -> str:
    """The text one session wrote to its log (e.g. a review's notes): its last `max_bytes` at
    most (memory stays bounded whatever the agent printed), optionally only `max_chars`."""
    return read_tail(log_path, result.log_start, result.log_end, max_bytes=max_bytes,
                     max_chars=max_chars)


def read_tail(path: Path, start: int = 0, end: int | None = None, *,
              max_bytes: int = OUTPUT_TAIL_BYTES, max_chars: int | None = None) -> str:
    """Bytes `start`..`end` (default: to the end) of `path`, of which only the last `max_bytes`
    are read, decoded as UTF-8 (a character cut at the edge is replaced)."""
    try:
        with open(path, "rb") as handle:
            if end is None:
                end = handle.seek(0, os.SEEK_END)
            begin = max(start, end - max_bytes)
            handle.seek(begin)
            data = handle.read(max(0, end - begin))
    except OSError:
        return ""
    text = data.decode("utf-8", "replace")
    return text[-max_chars:] if max_chars else text


def read_verdict(text: str) -> bool | None:
    """The last `BMAD-LOOP-VERDICT: APPROVED | CHANGES-REQUESTED` line in `text`, or None.

    Real CLIs exit 0 whenever their session completes, so a review run through them cannot say
    "changes requested" with its exit status; the shipped profiles ask the reviewer to print this
    line instead (profile `verdict = "marker"`).
    """
    verdict: bool | None = None
    for line in text.splitlines():
        line = line.strip().strip("*`_ ").strip()
        if line.upper().startswith(VERDICT_PREFIX):
            word = line[len(VERDICT_PREFIX):].strip().strip("*`_ .").upper()
            if word.startswith("APPROVE"):
                verdict = True
            elif word.startswith("CHANGES"):
                verdict = False
    return verdict


def review_approved(result: AgentResult, output: str, *, verdict: str = "exit") -> bool:
    """Did a review session approve? `verdict` is the profile's: "exit" or "marker".

    "exit": exit 0 approves (the contract for any CLI). "marker": the session must also have exited
    0 and its output must end its verdict with `BMAD-LOOP-VERDICT: APPROVED`; no marker is not an
    approval. Either way a session that timed out or was stopped approves nothing.
    """
    if not result.ok:
        return False
    if verdict == "marker":
        return read_verdict(output) is True
    if verdict != "exit":
        raise ConfigError(f"[adapter] verdict: unknown verdict mode {verdict!r} (known: exit, marker)")
    return True


# --------------------------------------------------------------------------- ending the session


