"""What an agent CLI reported about its own session, read back from the session log.

The shipped profiles run each CLI with its structured output (one JSON event per line), so the
session log is live for `attach` and its end says how the session went. `parse_output` reads a
log tail in one of these formats and returns a `SessionReport`: the agent's own words (its
messages, for the review verdict and the review notes), whether the CLI called the session an
error and in which words, and the tokens and cost it reported.

Formats (a profile's `output` key):
- `text`: plain output; nothing is reported but the text itself.
- `claude-stream-json`: `claude -p --output-format stream-json --verbose`. `assistant` events
  carry the messages; the final `result` event has `result`, `is_error`, `usage`
  (`input_tokens`, `output_tokens`, `cache_read_input_tokens`, `cache_creation_input_tokens`)
  and `total_cost_usd`.
- `codex-jsonl`: `codex exec --json`. `item.completed` events of type `agent_message` carry the
  messages; each `turn.completed` has `usage` (`input_tokens` including `cached_input_tokens`,
  `output_tokens`); `turn.failed` and `error` carry the error message. No cost is reported.
- `gemini-stream-json`: `gemini -o stream-json`. `message` events (role `assistant`) carry the
  messages; the final `result` event has `status`, `error` and `stats` (`input_tokens`
  including `cached`, `input` = the uncached part, `output_tokens`); `error` events carry
  warnings and errors. Also the single object of `gemini -o json` (`response`, `stats`, `error`).
- `qwen-stream-json`: `qwen -o stream-json`, Claude Code's event shapes, except that the final
  `result` event's `usage.input_tokens` includes `cache_read_input_tokens` and a failed session's
  words are in the result's `error.message`. No cost is reported.
- `opencode-json`: `opencode run --format json`. `text` events carry the messages (`part.text`);
  each `step_finish` has `part.tokens` (`input` without cache reads, `output`, `reasoning`,
  `cache.read`, `cache.write`) and `part.cost`; an `error` event (`error.name`, `error.data.message`,
  `error.data.statusCode`) ends a failed session.

Token counts are normalised so that `input_tokens` never includes cache reads: budgets count
input + output, and a cache read is not new input.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from typing import Callable

__all__ = ["FORMATS", "PARSERS", "USAGE_COLUMNS", "Usage", "SessionReport", "parse_output"]

USAGE_COLUMNS = ("input_tokens", "output_tokens", "cache_read_tokens", "cache_write_tokens", "cost_usd")


@dataclass(frozen=True)
class Usage:
    """Tokens and cost of one session as the CLI reported them; None where it reported none."""

    input_tokens: int | None = None
    output_tokens: int | None = None
    cache_read_tokens: int | None = None
    cache_write_tokens: int | None = None
    cost_usd: float | None = None

    def columns(self) -> dict:
        return {name: getattr(self, name) for name in USAGE_COLUMNS}

    @property
    def reported(self) -> bool:
        return any(v is not None for v in self.columns().values())


@dataclass(frozen=True)
class SessionReport:
    """One session's structured output, as far as the format tells it."""

    text: str  # the agent's own messages (the whole output for `text`)
    is_error: bool = False  # the CLI itself said the session failed
    error: str = ""  # in the CLI's words: its error fields and any line that is not an event
    usage: Usage = field(default_factory=Usage)
    structured: bool = False  # at least one event of the format was found


def parse_output(fmt: str, output: str) -> SessionReport:
    """Read `output` (a session's log text) in format `fmt` (see the module docstring)."""
    parser = PARSERS.get(fmt)
    if parser is None:  # `text`, or a format this version does not know
        return SessionReport(text=output)
    events, stray = _events(output)
    report = parser(events)
    # Lines that are not events are the CLI's own diagnostics (stderr): a fatal error before
    # any event, a usage-limit notice. The agent's tool output is always inside events. They go
    # first: the last line is what a failure is recorded by, and an error event is the CLI's own
    # word on it (codex prints "Reading additional input from stdin..." on stderr after it).
    error = "\n".join(part for part in ("\n".join(stray).strip(), report.error) if part)
    if not events:
        return SessionReport(text=output, error=error)
    return SessionReport(text=report.text, is_error=report.is_error, error=error,
                         usage=report.usage, structured=True)


def _events(output: str) -> tuple[list[dict], list[str]]:
    events, stray = [], []
    text = output.strip()
    if text.startswith("{") and text.endswith("}") and "\n{" not in text:
        try:  # `gemini -o json`: one pretty-printed object
            whole = json.loads(text)
            if isinstance(whole, dict):
                return [whole], []
        except ValueError:
            pass
    for line in output.splitlines():
        line = line.strip()
        if not line:
            continue
        if line.startswith("{"):
            try:
                event = json.loads(line)
            except ValueError:
                event = None
            if isinstance(event, dict):
                events.append(event)
                continue
        stray.append(line)
    return events, stray[-40:]


def _int(value) -> int | None:
    return int(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _sum(values) -> int | None:
    present = [v for v in values if v is not None]
    return sum(present) if present else None


def _claude(events: list[dict]) -> SessionReport:
    texts: list[str] = []
    result = None
    for event in events:
        kind = event.get("type")
        if kind == "assistant":
            content = (event.get("message") or {}).get("content") or []
            texts.extend(part.get("text", "") for part in content
                         if isinstance(part, dict) and part.get("type") == "text")
        elif kind == "result":
            result = event
    if result is None:
        return SessionReport(text="\n".join(texts))
    final = result.get("result")
    if isinstance(final, str) and final and (not texts or texts[-1].strip() != final.strip()):
        texts.append(final)
    usage = result.get("usage") or {}
    cost = result.get("total_cost_usd")
    report_usage = Usage(
        input_tokens=_int(usage.get("input_tokens")),
        output_tokens=_int(usage.get("output_tokens")),
        cache_read_tokens=_int(usage.get("cache_read_input_tokens")),
        cache_write_tokens=_int(usage.get("cache_creation_input_tokens")),
        cost_usd=float(cost) if isinstance(cost, (int, float)) and not isinstance(cost, bool) else None)
    is_error = bool(result.get("is_error")) or str(result.get("subtype", "success")) != "success"
    error = ""
    if is_error:
        error = final if isinstance(final, str) and final else str(result.get("subtype", "error"))
    return SessionReport(text="\n".join(texts), is_error=is_error, error=error, usage=report_usage)


def _codex(events: list[dict]) -> SessionReport:
    texts, errors = [], []
    inputs, cached, outputs, written = [], [], [], []
    failed = False
    for event in events:
        kind = event.get("type")
        if kind == "item.completed":
            item = event.get("item") or {}
            if item.get("type") == "agent_message" and isinstance(item.get("text"), str):
                texts.append(item["text"])
        elif kind == "turn.completed":
            # The turn's outcome decides: codex prints an `error` event for each retry of a
            # request ("Reconnecting... 1/5 (… 429 …)") even when a retry then succeeds.
            failed = False
            usage = event.get("usage") or {}
            inputs.append(_int(usage.get("input_tokens")))
            cached.append(_int(usage.get("cached_input_tokens")))
            outputs.append(_int(usage.get("output_tokens")))
            written.append(_int(usage.get("cache_write_input_tokens")))
        elif kind == "turn.failed":
            failed = True
            errors.append(str((event.get("error") or {}).get("message", "turn failed")))
        elif kind == "error":
            failed = True
            errors.append(str(event.get("message", "error")))
    total_in, total_cached = _sum(inputs), _sum(cached)
    fresh = None if total_in is None else max(0, total_in - (total_cached or 0))
    return SessionReport(text="\n".join(texts), is_error=failed,
                         error="\n".join(dict.fromkeys(errors)) if failed else "",
                         usage=Usage(input_tokens=fresh, output_tokens=_sum(outputs),
                                     cache_read_tokens=total_cached, cache_write_tokens=_sum(written)))


def _qwen(events: list[dict]) -> SessionReport:
    report = _claude(events)
    result = next((e for e in reversed(events) if e.get("type") == "result"), None)
    if result is None:
        return report
    usage = report.usage
    if usage.input_tokens is not None:  # the cache reads are inside input_tokens here
        usage = dataclasses.replace(usage, input_tokens=max(0, usage.input_tokens - (usage.cache_read_tokens or 0)))
    error = report.error
    if report.is_error and isinstance(result.get("error"), dict) and result["error"].get("message"):
        error = str(result["error"]["message"])
    return dataclasses.replace(report, usage=usage, error=error)


def _opencode(events: list[dict]) -> SessionReport:
    texts, errors = [], []
    tokens: dict[str, list] = {"input": [], "output": [], "read": [], "write": [], "cost": []}
    for event in events:
        kind, part = event.get("type"), event.get("part") or {}
        if kind == "text" and isinstance(part.get("text"), str):
            texts.append(part["text"])
        elif kind == "step_finish":
            used = part.get("tokens") or {}
            cache = used.get("cache") or {}
            for key, value in (("input", used.get("input")), ("output", used.get("output")),
                               ("read", cache.get("read")), ("write", cache.get("write"))):
                tokens[key].append(_int(value))
            cost = part.get("cost")
            tokens["cost"].append(float(cost) if isinstance(cost, (int, float)) and not isinstance(cost, bool) else None)
        elif kind == "error":
            error = event.get("error") or {}
            data = error.get("data") or {}
            status = f" (HTTP {data['statusCode']})" if data.get("statusCode") else ""
            errors.append(f"{error.get('name', 'Error')}: {data.get('message') or error.get('message', '')}{status}")
    costs = [c for c in tokens["cost"] if c is not None]
    usage = Usage(input_tokens=_sum(tokens["input"]), output_tokens=_sum(tokens["output"]),
                  cache_read_tokens=_sum(tokens["read"]), cache_write_tokens=_sum(tokens["write"]),
                  cost_usd=sum(costs) if costs else None)
    return SessionReport(text="\n".join(texts), is_error=bool(errors), error="\n".join(errors), usage=usage)


def _gemini(events: list[dict]) -> SessionReport:
    texts: list[str] = []
    errors: list[str] = []
    stats = None
    is_error = False
    for event in events:
        kind = event.get("type")
        if kind == "message" and event.get("role") == "assistant":
            content = event.get("content")
            if isinstance(content, str):
                if event.get("delta") and texts:
                    texts[-1] += content
                else:
                    texts.append(content)
        elif kind == "error" and event.get("severity") == "error":
            errors.append(str(event.get("message", "")))
        elif kind == "result":
            stats = event.get("stats") or stats
            if event.get("status") == "error":
                is_error = True
                errors.append(str((event.get("error") or {}).get("message", "error")))
        elif kind is None and ("response" in event or "error" in event or "stats" in event):
            # `-o json`: {response, stats, error}
            if isinstance(event.get("response"), str):
                texts.append(event["response"])
            if event.get("error"):
                is_error = True
                err = event["error"]
                errors.append(f"{err.get('type', 'Error')}: {err.get('message', '')}"
                              if isinstance(err, dict) else str(err))
            stats = _gemini_json_stats(event.get("stats")) or stats
    usage = Usage()
    if isinstance(stats, dict):
        total_in, cached = _int(stats.get("input_tokens")), _int(stats.get("cached"))
        fresh = _int(stats.get("input"))
        if fresh is None and total_in is not None:
            fresh = max(0, total_in - (cached or 0))
        usage = Usage(input_tokens=fresh, output_tokens=_int(stats.get("output_tokens")),
                      cache_read_tokens=cached)
    return SessionReport(text="\n".join(texts), is_error=is_error,
                         error="\n".join(e for e in errors if e), usage=usage)


def _gemini_json_stats(stats) -> dict | None:
    """`-o json` nests tokens per model (`stats.models.<name>.tokens`): summed into the
    stream-json shape."""
    if not isinstance(stats, dict) or not isinstance(stats.get("models"), dict):
        return None
    total = {"input_tokens": 0, "cached": 0, "output_tokens": 0}
    for model in stats["models"].values():
        tokens = (model or {}).get("tokens") or {}
        total["input_tokens"] += _int(tokens.get("prompt")) or 0
        total["cached"] += _int(tokens.get("cached")) or 0
        total["output_tokens"] += _int(tokens.get("candidates")) or 0
    return total


# Each structured format and its reader; the formats a profile's `output` may name are these
# and `text`, so a new format is one parser and one entry here.
PARSERS: dict[str, Callable[[list[dict]], SessionReport]] = {
    "claude-stream-json": _claude, "codex-jsonl": _codex, "gemini-stream-json": _gemini,
    "qwen-stream-json": _qwen, "opencode-json": _opencode}
FORMATS = ("text", *PARSERS)
