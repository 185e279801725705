"""The run report's timeline as inline SVG: the time axis, the story rows (or one block per
epic), the lane row and the worker slots' occupancy, from the boxes `geometry.layout_report` placed.

Strings are built with `html.escape`; every number is rounded to 0.01 px. Each bar carries
what it stands for as data-* attributes (story, start, end in seconds) and a <title> a browser
shows on hover, so the page is its own legend and a test can check the drawing against the data.
"""

from __future__ import annotations

from html import escape
from itertools import groupby

from ..style import format_duration
from .geometry import CHART_W, LABEL_W, SLOTS_H, Block, Box, TimelineLayout

__all__ = ["timeline_svg", "format_seconds"]

_MARK_PATHS = {  # a small glyph per mark, centred on (0, 0), drawn at the mark's place
    "integrated": "M0,-6 L5,0 L0,6 L-5,0 Z",
    "advanced": "M0,-6 L5,0 L0,6 L-5,0 Z",
    "escalated": "M-5,-5 L5,5 M5,-5 L-5,5",
    "failed": "M-5,-5 L5,5 M5,-5 L-5,5",
}


def format_seconds(seconds: float | None) -> str:
    """`-`, `7s`, `3m07s`, `2h05m`: whole seconds, half up, as every terminal table shows them
    (`style.format_duration`), so the page and the terminal agree."""
    return format_duration(seconds)


def _fit(label: str, room: int = 34) -> str:
    """A story key short enough for the label column (the whole key is in its tooltip)."""
    return label if len(label) <= room else label[:room - 1] + "…"


def _n(value: float) -> str:
    return f"{value:.2f}".rstrip("0").rstrip(".")


def _data(data: dict) -> str:
    return "".join(f' data-{name}="{escape(str(value))}"' for name, value in data.items())


def _box(box: Box, dy: float = 0.0, skip: str = "") -> str:
    """A bar (a rect) or a mark; `skip` leaves out a data-* attribute its group carries."""
    title = f"<title>{escape(box.title)}</title>"
    data = {k: v for k, v in box.data.items() if k != skip} if skip else box.data
    if box.w > 0:
        return (f'<rect class="bar k-{escape(box.kind)}" x="{_n(box.x)}" y="{_n(box.y + dy)}" '
                f'width="{_n(box.w)}" height="{_n(box.h)}"{_data(data)}>{title}</rect>')
    glyph = _MARK_PATHS.get(box.kind)
    cy = box.y + dy + box.h / 2
    if glyph is None:
        return (f'<line class="mark m-{escape(box.kind)}" x1="{_n(box.x)}" x2="{_n(box.x)}" '
                f'y1="{_n(box.y + dy)}" y2="{_n(box.y + dy + box.h)}"{_data(data)}>{title}</line>')
    return (f'<path class="mark m-{escape(box.kind)}" transform="translate({_n(box.x)},{_n(cy)})" '
            f'd="{glyph}"{_data(data)}>{title}</path>')


def _grid(layout: TimelineLayout, height: float) -> str:
    lines = [f'<line class="grid" x1="{_n(layout.scale.x(t))}" x2="{_n(layout.scale.x(t))}" '
             f'y1="0" y2="{_n(height)}"/>' for t, _active in layout.scale.ticks()]
    pauses = [f'<rect class="paused" x="{_n(a)}" y="0" width="{_n(b - a)}" height="{_n(height)}" '
              f'data-seconds="{_n(seconds)}"><title>paused or stopped for '
              f'{escape(format_duration(seconds))} (collapsed: not active time)</title></rect>'
              for a, b, seconds in layout.pauses]
    return "".join(lines + pauses)


def _svg(css_class: str, height: float, body: str, extra: str = "") -> str:
    width = LABEL_W + CHART_W + 20
    return (f'<svg class="{css_class}" xmlns="http://www.w3.org/2000/svg" width="{width}" '
            f'height="{_n(height)}" viewBox="0 0 {width} {_n(height)}"{extra}>{body}</svg>')


def _axis(layout: TimelineLayout) -> str:
    parts = []
    for t, active in layout.scale.ticks():  # labelled in active time: gaps do not count
        x = _n(layout.scale.x(t))
        parts.append(f'<line class="tick" x1="{x}" x2="{x}" y1="16" y2="22"/>'
                     f'<text class="tick" x="{x}" y="12">{escape(format_seconds(active))}</text>')
    return _svg("axis", 24, "".join(parts))


def _block(layout: TimelineLayout, block: Block, row_class: str) -> str:
    labels = "".join(f'<text class="label" x="4" y="{_n(y)}" data-label="{escape(text)}" '
                     f'title="{escape(title)}"><title>{escape(title)}</title>{escape(_fit(text))}</text>'
                     for y, text, title in block.labels)
    if row_class == "rows":  # one <g data-story> per story: its bars need not repeat the key
        boxes = "".join(f'<g class="story" data-story="{escape(key)}">'
                        + "".join(_box(box, skip="story") for box in group) + "</g>"
                        for key, group in groupby(block.boxes, key=lambda b: b.data.get("story")))
    else:
        boxes = "".join(_box(box) for box in block.boxes)
    return _svg(row_class, block.height, _grid(layout, block.height) + labels + boxes,
                f' data-block="{escape(block.name)}"')


def _slots(layout: TimelineLayout, n: int) -> str:
    points = " ".join(f"{_n(x)},{_n(y)}" for x, y in layout.slot_points)
    first_x, last_x = layout.slot_points[0][0], layout.slot_points[-1][0]
    area = f"{_n(first_x)},{_n(SLOTS_H - 2)} {points} {_n(last_x)},{_n(SLOTS_H - 2)}"
    body = (_grid(layout, SLOTS_H)
            + f'<polygon class="slots" points="{area}"><title>worker slots in use</title></polygon>'
            + f'<line class="slot-n" x1="{LABEL_W}" x2="{LABEL_W + CHART_W}" '
              f'y1="{_n(layout.slot_n_y)}" y2="{_n(layout.slot_n_y)}"/>'
            + f'<text class="tick" x="{LABEL_W - 6}" y="{_n(layout.slot_n_y + 4)}" '
              f'text-anchor="end">N = {n}</text>')
    return _svg("slots", SLOTS_H, body)


def _epic_group(layout: TimelineLayout, block: Block) -> str:
    summary = _svg("epic-summary", block.summary.h + 4 if block.summary else 22,
                   (_box(block.summary, 2) if block.summary else "")
                   + f'<text class="label" x="4" y="15">{escape(block.name)}</text>')
    count = len(block.labels)
    return (f'<details class="epic" data-epic="{escape(block.name)}"><summary>'
            f'{escape(block.name)}: {count} stor{"y" if count == 1 else "ies"}{summary}</summary>'
            f'{_block(layout, block, "rows")}</details>')


def timeline_svg(layout: TimelineLayout, n: int) -> str:
    """The axis, the story rows, the lane and the slots, as one HTML fragment."""
    if layout.grouped:
        rows = "".join(_epic_group(layout, block) for block in layout.blocks)
    else:
        rows = "".join(_block(layout, block, "rows") for block in layout.blocks)
    lane = _block(layout, layout.lane, "lane")
    lane_label = '<div class="row-title">integration lane (each candidate: compose, verify, ' \
                 'wait to advance; overlapping verifies are a speculative stack)</div>'
    return (f'<div class="timeline">{_axis(layout)}{rows}{lane_label}{lane}'
            f'<div class="row-title">worker slots in use</div>{_slots(layout, n)}</div>')
