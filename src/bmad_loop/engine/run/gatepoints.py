"""Where a run will stop for a human, said before it starts.

An overnight run should not surprise its owner in the morning: `run` prints, once the plan is
fixed, every point at which the gates (`[gates] mode`, or `run --gates`) will pause it, and
whether an escalation pauses it too (`[parallel] on_escalation`).
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["gate_epics", "pause_summary"]


def gate_epics(plan: Sequence) -> list[tuple[str, str]]:
    """(epic, first story key) for each epic after the plan's first, in order of first
    appearance: where `per-epic` gates pause the run (the first epic starts without a gate)."""
    seen: list[str] = []
    points: list[tuple[str, str]] = []
    for story in plan:
        epic = str(story.epic)
        if epic in seen or not epic:  # a story in no epic ("") never meets a gate (admission)
            continue
        if seen:
            points.append((epic, story.key))
        seen.append(epic)
    return points


def pause_summary(plan: Sequence, gates_mode: str, on_escalation: str) -> str:
    """One line: where this plan will pause, under this gates mode."""
    if gates_mode == "per-epic":
        points = gate_epics(plan)
        if points:
            where = ", ".join(f"before epic {epic} ({key})" for epic, key in points)
            gates = f"gates per-epic: pauses {where}; `bmad-loop resume` opens each gate"
        else:
            gates = "gates per-epic: one epic in the plan, no gate pause"
    elif gates_mode == "per-story-spec-approval":
        gates = (f"gates per-story-spec-approval: each of the {len(plan)} stories waits for "
                 "`bmad-loop approve RUN STORY` before dev")
    else:
        gates = "gates none: no gate pause"
    if on_escalation == "pause":
        return f"{gates}; a story that needs a human pauses the run"
    return f"{gates}; a story that needs a human is parked and the rest go on"
