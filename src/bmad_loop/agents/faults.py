"""Telling an environment fault of an agent CLI from a story that failed.

A session that the CLI ended with an error is an *environment fault* when the error says the
agent could not work at all — a rate or usage limit, a login that expired, a folder the CLI does
not trust, a model it does not know, no network — and a *story failure* otherwise. An
environment fault charges no attempt: the run pauses (or, with `[adapter] on_limit = "wait"`
and a reset time the CLI printed, waits for it). Which words and exit codes mean which fault
is data in each profile (`[faults]`, `[fault_exit_codes]`); `classify` only applies them.

Only the CLI's own error channel is searched (see `agents.output.SessionReport.error`), and only
when the session failed, so an agent that works on rate limiting and prints "rate limit" in a
test run is never taken for a rate-limited CLI.
"""

from __future__ import annotations

import datetime as dt
import re
from dataclasses import dataclass
from typing import Mapping, Sequence

from .output import SessionReport

__all__ = ["CATEGORIES", "LIMITS", "AgentFault", "classify", "reset_time"]

# The environment faults, in the order a message is tested against them (the first wins).
CATEGORIES = ("usage-limit", "rate-limit", "auth", "trust", "model", "network")
LIMITS = ("usage-limit", "rate-limit")  # the faults a reset time can end
_WORDS_MAX = 500


@dataclass(frozen=True)
class AgentFault:
    """An environment fault: what kind, the CLI's own words, and when it ends if it said so."""

    category: str
    words: str
    reset_at: dt.datetime | None = None

    def reason(self) -> str:
        return f"{self.category}: {self.words}"


def classify(report: SessionReport, exit_code: int | None, *,
             patterns: Mapping[str, Sequence[re.Pattern]],
             exit_codes: Mapping[int, str], now: dt.datetime | None = None) -> AgentFault | None:
    """The environment fault behind a finished session, or None (success or a story failure).

    A session counts as failed when it exited non-zero or its structured output says error;
    then its exit code (`exit_codes`) or the first matching pattern decides the category.
    """
    if not ((exit_code is not None and exit_code != 0) or report.is_error):
        return None
    words = report.error.strip()
    if not words and not report.structured:
        words = report.text.strip()[-2000:]  # plain output: its end is where a CLI says why
    now = now or dt.datetime.now(dt.timezone.utc)
    category = exit_codes.get(exit_code) if exit_code is not None else None
    line = _matching_line(words, patterns.get(category, ())) if category else None
    if category is None:
        for name in CATEGORIES:
            line = _matching_line(words, patterns.get(name, ()))
            if line is not None:
                category = name
                break
    if category is None:
        return None
    shown = (line or (words.splitlines()[-1] if words else f"exit code {exit_code}")).strip()
    return AgentFault(category, shown[:_WORDS_MAX],
                      reset_time(words, now) if category in LIMITS else None)


def _matching_line(text: str, patterns: Sequence[re.Pattern]) -> str | None:
    for line in text.splitlines():
        if any(p.search(line) for p in patterns):
            return line
    return None


# ---------------------------------------------------------------- when a limit ends

_UNITS = {"ms": 0.001, "s": 1, "sec": 1, "second": 1, "m": 60, "min": 60, "minute": 60,
          "h": 3600, "hr": 3600, "hour": 3600, "d": 86400, "day": 86400}
_AMOUNT = re.compile(r"(\d+(?:\.\d+)?)\s*(ms|seconds?|secs?|s|minutes?|mins?|m|hours?|hrs?|h|days?|d)\b",
                     re.I)
_IN = re.compile(r"(?:retry|try again|resets?|available|wait)\s+(?:in|after)\s+"
                 r"((?:\d+(?:\.\d+)?\s*[a-z]+[\s,]*(?:and\s+)?)+)", re.I)
_EPOCH = re.compile(r"(?:resets?_?at|reset|resetsAt|retry_?at)\W{0,4}(\d{10})(?:\d{3})?\b", re.I)
_CLOCK = re.compile(r"(?:resets?|try again at|available at|retry at)\s+(?:at\s+)?"
                    r"(\d{1,2})(?::(\d{2}))?\s*([ap]\.?m\.?)?"
                    r"(?:\s*\(([A-Za-z_]+/[A-Za-z_]+(?:/[A-Za-z_]+)?|UTC)\))?", re.I)


def reset_time(text: str, now: dt.datetime) -> dt.datetime | None:
    """When the CLI said its limit ends, from its words: a delay ("try again in 20s",
    "Please retry in 1.5s", "in 3 days 6 hours"), an epoch ("resetsAt": 1767225600) or a
    clock time ("resets 1pm", "try again at 3:28 PM", "resets 5am (Europe/Paris)": the next
    such time, in that zone or else this machine's). None when it said none."""
    now = now if now.tzinfo else now.replace(tzinfo=dt.timezone.utc)
    m = _IN.search(text)
    if m:
        seconds = sum(float(n) * _unit(u) for n, u in _AMOUNT.findall(m.group(1)))
        if seconds > 0:
            return now + dt.timedelta(seconds=seconds)
    m = _EPOCH.search(text)
    if m:
        return dt.datetime.fromtimestamp(int(m.group(1)), dt.timezone.utc)
    m = _CLOCK.search(text)
    if m and (m.group(2) or m.group(3)):
        hour, minute, half = int(m.group(1)), int(m.group(2) or 0), (m.group(3) or "").lower()
        if half.startswith("p") and hour < 12:
            hour += 12
        elif half.startswith("a") and hour == 12:
            hour = 0
        if hour > 23 or minute > 59:
            return None
        zone = _zone(m.group(4))
        local_now = now.astimezone(zone)
        at = local_now.replace(hour=hour, minute=minute, second=0, microsecond=0)
        if at <= local_now:
            at += dt.timedelta(days=1)
        return at.astimezone(dt.timezone.utc)
    return None


def _unit(word: str) -> float:
    word = word.lower().rstrip("s") if word.lower() not in ("s", "ms") else word.lower()
    return _UNITS.get(word, _UNITS.get(word[:1], 1))


def _zone(name: str | None):
    if name:
        if name.upper() == "UTC":
            return dt.timezone.utc
        try:
            from zoneinfo import ZoneInfo

            return ZoneInfo(name)
        except Exception:  # an unknown zone name: this machine's zone is the best guess
            pass
    return dt.datetime.now().astimezone().tzinfo
