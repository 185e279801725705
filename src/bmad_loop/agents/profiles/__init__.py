"""Agent profiles: how to run a real CLI (claude, codex, gemini, opencode, qwen) headless, as shipped data.

Each profile is a TOML file beside this module (see README.md here for every flag and where it was
checked). A profile gives the argv template, the arguments that select a model, the untracked
per-repo config files the CLI reads (seeded into each worktree when `[scm] seed_adapter_defaults`
is on), environment variables it needs, how a review reports its verdict, and per-phase tasks that
replace the default ones (`bmad_loop.agents.prompts.DEFAULT_TASKS`); the ground rules always follow.
"""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass, field
from importlib import resources
from pathlib import PurePosixPath
from types import MappingProxyType
from typing import Mapping, Sequence

from ..faults import CATEGORIES
from ..output import FORMATS
from ...errors import ConfigError
from ..prompts import DEFAULT_TASKS, PHASE_INSTRUCTIONS, compose
from ...states import AGENT_PHASES

__all__ = ["Profile", "known_profiles", "load_profile", "resolve_command", "phase_instructions",
           "known_cli_of", "custom_command_warnings"]

_KEYS = {"description", "command", "model_args", "seed_files", "env", "verdict", "instructions",
         "output", "faults", "fault_exit_codes", "checked_version", "boxed_command",
         "session_files"}
_PROFILE_DIR = "{profile_dir}"  # in an env value: the folder of the shipped profiles
_VERDICTS = ("exit", "marker")


@dataclass(frozen=True)
class Profile:
    name: str
    command: tuple[str, ...]
    model_args: tuple[str, ...]  # appended only when a model is set (no dangling --model)
    seed_files: tuple[str, ...]  # repo-relative, untracked config files the CLI reads
    instructions: Mapping[str, str]  # phase -> full instructions (task + ground rules), every phase
    env: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))  # merged by the caller, under [adapter.env]
    verdict: str = "exit"  # "exit": exit status is the review verdict; "marker": a printed line
    description: str = ""
    output: str = "text"  # the format of its session log (bmad_loop.agents.output.FORMATS)
    # environment-fault category -> patterns of the CLI's error words; exit code -> category
    faults: Mapping[str, tuple[re.Pattern, ...]] = field(default_factory=lambda: MappingProxyType({}))
    fault_exit_codes: Mapping[int, str] = field(default_factory=lambda: MappingProxyType({}))
    checked_version: str = ""  # the CLI release its flags were checked against ("" unknown)
    # The command when bmad-loop's sandbox boxes the session (empty: `command`): for a CLI whose
    # own sandbox cannot start inside another one, that sandbox turned off.
    boxed_command: tuple[str, ...] = ()
    # name -> text: files written beside the prompt, in the session folder, before each session
    session_files: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))


def known_profiles() -> tuple[str, ...]:
    """Names of the shipped profiles."""
    folder = resources.files(__name__)
    return tuple(sorted(entry.name[: -len(".toml")] for entry in folder.iterdir() if entry.name.endswith(".toml")))


def load_profile(name: str) -> Profile:
    """The shipped profile `name`; a ConfigError for unknown names or malformed data."""
    data = _read(name)
    source = f"profile {name!r}"
    command = _strings(data.get("command"), f"{source} command")
    if not command:
        raise ConfigError(f"{source} command: must not be empty")
    tasks = _tasks(data.get("instructions", {}), f"{source} instructions")
    exit_codes = _exit_codes(data.get("fault_exit_codes", {}), f"{source} fault_exit_codes")
    return Profile(
        name=name,
        command=command,
        model_args=_strings(data.get("model_args", []), f"{source} model_args"),
        seed_files=_seed_files(data.get("seed_files", []), f"{source} seed_files"),
        instructions=MappingProxyType({p: compose(p, tasks.get(p, DEFAULT_TASKS[p])) for p in AGENT_PHASES}),
        env=MappingProxyType(_env(data.get("env", {}), f"{source} env")),
        verdict=_choice(data.get("verdict", "exit"), _VERDICTS, f"{source} verdict"),
        description=str(data.get("description", "")),
        output=_choice(data.get("output", "text"), FORMATS, f"{source} output"),
        checked_version=str(data.get("checked_version", "")),
        boxed_command=_strings(data.get("boxed_command", []), f"{source} boxed_command"),
        faults=_faults(data.get("faults", {}), f"{source} faults"),
        fault_exit_codes=MappingProxyType(exit_codes),
        session_files=MappingProxyType(_session_files(data.get("session_files", {}),
                                                      f"{source} session_files")),
    )


def _read(name: str) -> dict:
    """The TOML table of the shipped profile `name`, its keys checked."""
    known = known_profiles()
    if name not in known:
        raise ConfigError(f"[adapter] profile: unknown profile {name!r} (known: {', '.join(known)})")
    source = f"profile {name!r}"
    try:
        data = tomllib.loads(resources.files(__name__).joinpath(f"{name}.toml").read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{source}: invalid TOML: {exc}") from exc
    unknown = sorted(set(data) - _KEYS)
    if unknown:
        raise ConfigError(f"{source}: unknown key {unknown[0]!r}")
    return data


def _seed_files(value: object, where: str) -> tuple[str, ...]:
    seed_files = _strings(value, where)
    for path in seed_files:
        pure = PurePosixPath(path)
        if pure.is_absolute() or ".." in pure.parts or not path:
            raise ConfigError(f"{where}: {path!r} must be a path inside the repository")
    return seed_files


def _choice(value: object, choices: Sequence[str], where: str) -> str:
    if not isinstance(value, str) or value not in choices:
        raise ConfigError(f"{where}: must be one of {', '.join(choices)}, not {value!r}")
    return value


def _env(value: object, where: str) -> dict[str, str]:
    """A table of strings, `{profile_dir}` standing for the folder of the shipped profiles."""
    if not isinstance(value, dict) or not all(isinstance(v, str) for v in value.values()):
        raise ConfigError(f"{where}: must be a table of strings")
    folder = str(resources.files(__name__))
    return {key: text.replace(_PROFILE_DIR, folder) for key, text in value.items()}


def _session_files(value: object, where: str) -> dict[str, str]:
    if not isinstance(value, dict) or not all(
            isinstance(v, str) and k and PurePosixPath(k).name == k and k not in (".", "..")
            for k, v in value.items()):
        raise ConfigError(f"{where}: must be a table of plain file names = text")
    return dict(value)


def _tasks(value: object, where: str) -> dict[str, str]:
    if not isinstance(value, dict) or not all(isinstance(v, str) for v in value.values()):
        raise ConfigError(f"{where}: must be a table of strings")
    for phase in value:
        if phase not in AGENT_PHASES:
            raise ConfigError(f"{where}: unknown phase {phase!r} (known: {', '.join(AGENT_PHASES)})")
    return value


def _exit_codes(value: object, where: str) -> dict[int, str]:
    if not isinstance(value, dict) or not all(
            str(k).isdigit() and v in CATEGORIES for k, v in value.items()):
        raise ConfigError(f"{where}: must map exit codes to one of {', '.join(CATEGORIES)}")
    return {int(k): v for k, v in value.items()}


def _faults(value: object, where: str) -> Mapping[str, tuple[re.Pattern, ...]]:
    if not isinstance(value, dict):
        raise ConfigError(f"{where}: must be a table of category = [patterns]")
    out = {}
    for category, patterns in value.items():
        if category not in CATEGORIES:
            raise ConfigError(f"{where}: unknown category {category!r} (known: {', '.join(CATEGORIES)})")
        try:
            out[category] = tuple(re.compile(p) for p in _strings(patterns, f"{where}.{category}"))
        except re.error as exc:
            raise ConfigError(f"{where}.{category}: invalid pattern: {exc}") from exc
    return MappingProxyType(out)


def resolve_command(
    *,
    profile: str,
    command: Sequence[str],
    phase_command: Sequence[str] | None,
    model: str,
    tier_args: Sequence[str],
    extra_args: Sequence[str] = (),
    boxed: bool = False,
) -> list[str]:
    """The argv template for one session, before placeholders are rendered.

    The phase's own `command` wins over `[adapter] command`, which wins over the profile's command
    (plus its `model_args` when `model` is non-empty). `[adapter] extra_args` follow whichever
    command it is, so a flag can be added to a profile without replacing it; the tier's extra
    arguments come last. `boxed`: the session runs in bmad-loop's sandbox, so a profile's
    `boxed_command` (its CLI with its own sandbox turned off, where that one cannot start
    inside another) replaces its `command`.
    """
    if phase_command:
        template = list(phase_command)
    elif command:
        template = list(command)
    elif profile:
        chosen = load_profile(profile)
        command = chosen.boxed_command if boxed and chosen.boxed_command else chosen.command
        template = list(command) + (list(chosen.model_args) if model else [])
    else:
        raise ConfigError("[adapter]: set either profile or command")
    return template + list(extra_args) + list(tier_args)


def known_cli_of(argv: Sequence[str]) -> str | None:
    """The shipped profile whose CLI `argv` runs (`claude`, `/usr/bin/codex`, `npx gemini`…),
    or None."""
    names = set(known_profiles())
    for element in list(argv)[:3]:
        base = PurePosixPath(str(element).replace("\\", "/")).name
        for suffix in (".exe", ".cmd", ".js"):
            base = base.removesuffix(suffix)
        if base in names:
            return base
    return None


def custom_command_warnings(adapter) -> list[str]:
    """What `validate` warns about an `[adapter]` whose own command runs a known CLI whose
    review verdict is read from the exit status: those CLIs exit 0 whenever a session
    completes, so every review would approve."""
    warnings = []
    review = adapter.phase("review").command
    commands = [("[adapter.review] command", review)] if review else [("[adapter] command", adapter.command)]
    for where, command in commands:
        cli = known_cli_of(command or ())
        if cli is not None and (adapter.verdict or "exit") == "exit":
            warnings.append(
                f"{where} runs {cli}, which exits 0 whenever its session completes, with exit-code "
                f'verdicts: every review would approve; set [adapter] verdict = "marker" or use '
                f'profile = "{cli}" (with [adapter] extra_args for your flags)')
    return warnings


def phase_instructions(phase: str, profile: str = "") -> str:
    """The instructions for `phase`: the profile's when a profile is named, else the defaults."""
    if phase not in AGENT_PHASES:
        raise ValueError(f"unknown phase {phase!r} (known: {', '.join(AGENT_PHASES)})")
    return load_profile(profile).instructions[phase] if profile else PHASE_INSTRUCTIONS[phase]


def _strings(value: object, where: str) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ConfigError(f"{where}: must be a list of strings")
    return tuple(value)
