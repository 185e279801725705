"""`bmad-loop history`: the project's runs with story counts, durations and outcome.

Read from the same rows the engine writes (runs, stories, events); nothing is kept on the side.
"""

from __future__ import annotations

from sqlalchemy import func, select

from ..db.models import Event, Run, Story, utcnow
from ..engine.run.consumers import exit_code_for
from ..engine.usage import empty_usage, usage_by_run
from ..states import RUN_SETTLED, RunState, StoryState
from .style import format_duration

__all__ = ["run_history", "outcome_of", "format_history", "format_duration", "tokens_cell", "cost_cell"]

OUTCOMES = {0: "success", 1: "failed", 3: "needs a human", 4: "stopped", 130: "interrupted"}


def outcome_of(run: Run, stories) -> tuple[str, int | None]:
    """The outcome word and the exit code `run`/`resume` would give for the run as it stands."""
    if run.state not in RUN_SETTLED:
        return "in progress", None
    code = exit_code_for(run, stories)
    return OUTCOMES.get(code, "failed"), code


def _iso(value):
    return value.strftime("%Y-%m-%dT%H:%M:%SZ") if value else None


def run_history(session, project_key: str, *, limit: int | None = None, now=None) -> list[dict]:
    """Newest first: one dict per run of the project."""
    now = now or utcnow()
    query = (select(Run).where(Run.project == project_key)
             .order_by(Run.created_at.desc(), Run.id.desc()))
    if limit:
        query = query.limit(limit)
    runs = list(session.scalars(query))
    if not runs:
        return []
    ids = [r.id for r in runs]
    stories: dict[str, list[Story]] = {i: [] for i in ids}
    for story in session.scalars(select(Story).where(Story.run_id.in_(ids)).order_by(Story.seq)):
        stories[story.run_id].append(story)
    last_event = dict(session.execute(select(Event.run_id, func.max(Event.ts))
                                      .where(Event.run_id.in_(ids)).group_by(Event.run_id)).all())
    usage = usage_by_run(session, ids)
    out = []
    for run in runs:
        members = stories[run.id]
        counts: dict[str, int] = {state: 0 for state in StoryState}
        for story in members:
            counts[story.state] = counts.get(story.state, 0) + 1
        outcome, code = outcome_of(run, members)
        last = last_event.get(run.id)
        last = _aware(last) if last is not None else None
        start = run.started_at or run.created_at
        end = run.ended_at or (last if run.state in RUN_SETTLED else now)
        out.append({
            "id": run.id,
            "state": run.state,
            "outcome": outcome,
            "exit_code": code,
            "reason": run.reason,
            "target_branch": run.target_branch,
            "merge_strategy": run.merge_strategy,
            "max_parallel": run.max_parallel,
            "created_at": _iso(run.created_at),
            "ended_at": _iso(run.ended_at),
            "last_event_at": _iso(last),
            "duration_s": round((end - start).total_seconds(), 1) if end and start else None,
            "stories": len(members),
            "counts": {k: v for k, v in counts.items() if v},
            "start_sha": run.target_sha,
            "head_sha": run.head_sha or run.target_sha,
            "usage": usage.get(run.id) or empty_usage(),  # the agent CLIs' own reports, summed
        })
    return out


def _aware(value):
    import datetime as dt

    if isinstance(value, str):
        value = dt.datetime.fromisoformat(value)
    return value.replace(tzinfo=dt.timezone.utc) if value.tzinfo is None else value


def format_history(entries: list[dict]) -> str:
    if not entries:
        return "no runs yet"
    header = ("RUN", "STATE", "OUTCOME", "DURATION", "STORIES", "TOKENS", "COST", "COUNTS")
    rows = [(e["id"], e["state"], e["outcome"], format_duration(e["duration_s"]), str(e["stories"]),
             tokens_cell(e["usage"]), cost_cell(e["usage"]),
             ", ".join(f"{n} {state}" for state, n in e["counts"].items()))
            for e in entries]
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(header)]
    right = {3, 4, 5, 6}

    def line(values):
        return "  ".join(v.rjust(w) if i in right else v.ljust(w)
                         for i, (v, w) in enumerate(zip(values, widths))).rstrip()

    lines = [line(header)] + [line(r) for r in rows]
    for e in entries:
        if e["reason"] and e["state"] != RunState.COMPLETED:
            lines.append(f"  {e['id']}: {e['reason']}")
    return "\n".join(lines)


def tokens_cell(usage: dict) -> str:
    """Input + output tokens (cache reads are not new work), or "-" when no CLI reported any."""
    if usage.get("input_tokens") is None and usage.get("output_tokens") is None:
        return "-"
    return f"{(usage.get('input_tokens') or 0) + (usage.get('output_tokens') or 0):,}"


def cost_cell(usage: dict) -> str:
    return "-" if usage.get("cost_usd") is None else f"${usage['cost_usd']:.2f}"
