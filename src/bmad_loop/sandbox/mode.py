"""What `sandbox = "auto" | "on" | "off"` means on this host.

Linux: bubblewrap, if its probe succeeds; `auto` runs unboxed with a warning when it does not,
`on` is refused (exit 2) naming why. macOS: sandbox-exec with a generated profile, only when
asked for (`on`): CI cannot run a Mac, so `auto` means off there, with a note. Elsewhere: no box.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

from ..errors import ConfigError
from . import probe

__all__ = ["MODES", "BoxDecision", "decide", "startup_notes"]

MODES = ("auto", "on", "off")


@dataclass(frozen=True)
class BoxDecision:
    boxed: bool
    backend: str  # "bwrap" | "sandbox-exec" | "" (unboxed)
    program: str  # the backend's executable
    note: str  # unboxed although not "off": why (for the warning of validate and run)


def decide(mode: str, key: str, platform: str | None = None) -> BoxDecision:
    """The box `mode` gives on `platform` (default: this one); `key` names the setting in the
    error raised when `on` cannot be honoured."""
    platform = platform or sys.platform
    if mode == "off":
        return BoxDecision(False, "", "", "")
    if platform == "darwin":
        if mode == "auto":
            return BoxDecision(False, "", "", 'off on macOS: the generated sandbox-exec profile '
                                              'is opt-in (set "on")')
        found = probe.probe_sandbox_exec()
        return _chosen(found, "sandbox-exec", mode, key)
    if platform.startswith("linux"):
        return _chosen(probe.probe_bwrap(), "bwrap", mode, key)
    return _chosen(probe.Probe(False, "", f"no sandbox on {platform}"), "", mode, key)


def _chosen(found: probe.Probe, backend: str, mode: str, key: str) -> BoxDecision:
    if found.ok:
        return BoxDecision(True, backend, found.program, "")
    if mode == "on":
        raise ConfigError(f'{key} = "on": {found.detail}')
    return BoxDecision(False, "", "", f"running unboxed: {found.detail}")


def startup_notes(policy) -> list[str]:
    """The warnings `validate` and `run` print for the policy's sandbox settings (unboxed
    although not off), one per reason, naming the keys; raises ConfigError when one says
    "on" and cannot be honoured."""
    keys_by_note: dict[str, list[str]] = {}
    for mode, key in ((policy.adapter.sandbox, "[adapter] sandbox"),
                      (policy.verify.sandbox, "[verify] sandbox")):
        note = decide(mode, key).note
        if note:
            keys_by_note.setdefault(note, []).append(key)
    return [f'{" and ".join(keys)} = "auto": {note}' for note, keys in keys_by_note.items()]
