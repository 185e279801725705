"""Followers: `journal --follow` tails the events of a run, `attach` tails a story's session log.

Both poll the rows through a read-only `Reader` (never the write lock), print what is new, and
end when there is nothing more to come: the run settled (journal), or the story left its worker
and its last session log is drained (attach). A `stop` event ends either at once (Ctrl+C).
"""

from __future__ import annotations

import codecs
import threading
from pathlib import Path
from typing import Callable

from sqlalchemy import select

from ..db.models import Attempt, Run, Story
from ..engine.journal import event_json, events_after
from ..engine.runrows import stories_of
from ..bmad.selection import resolve_story_ref
from ..errors import Ambiguous, ConfigError, NotFound
from ..agents.logcap import CutState, read_cut
from ..states import RUN_SETTLED, STORY_IN_FLIGHT, StoryState
from .style import short_value

_CHUNK = 1 << 20  # what one read of a log holds in memory

__all__ = ["follow_journal", "format_event", "pick_story", "story_ref", "follow_log", "AttachChoice",
           "live_tmux_session", "not_started", "wait_for_start", "LogTail"]

# A story in these states has no session yet: `attach` waits for it, like `tail -F`.
NOT_STARTED = frozenset({StoryState.PENDING, StoryState.QUEUED})


def _short(value):
    if isinstance(value, str) and "\n" in value:
        first = value.strip().splitlines()[0] if value.strip() else ""
        return first + " …"
    return short_value(value)


def format_event(line: dict) -> str:
    """One journal line for people: seq, time, kind, story, data."""
    story_part = f" {line['story']}" if line["story"] else ""
    data = " ".join(f"{k}={_short(v)}" for k, v in line["data"].items())
    return f"{line['seq']:>5} {line['ts']} {line['kind']}{story_part} {data}".rstrip()


# How often a follower looks again: the journal (a query), a log (a stat and a read).
JOURNAL_POLL_S = 0.5
LOG_POLL_S = 0.2


def follow_journal(reader, run_id: str, emit: Callable[[dict], None], *, kinds=(), story=None,
                   follow: bool = True, stop: threading.Event | None = None) -> None:
    """Emit the run's events in order; with `follow`, keep emitting until the run settles."""
    stop = stop or threading.Event()
    last = 0
    settled_seen = False
    while True:
        with reader.session() as s:
            events = events_after(s, run_id, last, kinds, story)
            run = s.get(Run, run_id)
            settled = run is None or run.state in RUN_SETTLED
            lines = [event_json(e) for e in events]
        for line in lines:
            last = line["seq"]
            emit(line)
        if not follow:
            return
        if settled:
            if settled_seen and not lines:
                return  # one quiet poll after settling: late events (notifications) are in
            settled_seen = True
        else:
            settled_seen = False
        if stop.wait(JOURNAL_POLL_S):
            return


# ---------------------------------------------------------------------------- attach
class AttachChoice(ConfigError):
    """Several stories could be meant: the message lists them (exit 2)."""


def pick_story(reader, run_id: str, ref: str | None) -> str:
    """The story to attach to: the one named, else the only one in flight, else the only one
    with a session log. Ambiguity is AttachChoice naming the candidates."""
    with reader.session() as s:
        stories = stories_of(s, run_id)
        if ref is not None:
            return story_ref(stories, ref, run_id)
        rows = [(st.key, st.state, st.phase, st.session, st.log) for st in stories]
    flying = [r for r in rows if r[1] in STORY_IN_FLIGHT]
    pool = flying or [r for r in rows if r[4]]
    if len(pool) == 1:
        return pool[0][0]
    if not pool:
        raise NotFound(f"run {run_id}: no story has a session yet")
    what = "in flight" if flying else "with a session log"
    listing = "; ".join(f"{r[0]} ({r[1]}{', ' + r[2] if r[2] else ''}"
                        f"{', session ' + r[3] if r[3] else ''})" for r in pool)
    raise AttachChoice(f"run {run_id}: {len(pool)} stories {what}, name one: {listing}")


def story_ref(stories, ref: str, run_id: str) -> str:
    """The full key `ref` names (`resolve_story_ref`); an ambiguous one is an AttachChoice."""
    try:
        return resolve_story_ref(stories, ref, f"run {run_id}")
    except Ambiguous as exc:
        raise AttachChoice(str(exc)) from None


def not_started(reader, run_id: str, story_key: str) -> str | None:
    """"waiting for KEY (pending)" (with what holds it back) while the story has no session
    yet, else None."""
    with reader.session() as s:
        row = s.query(Story).filter(Story.run_id == run_id, Story.key == story_key).one()
        if row.state not in NOT_STARTED or row.log:
            return None
        return f"waiting for {story_key} ({row.state})" + (f": {row.wait_reason}" if row.wait_reason else "")


def wait_for_start(reader, run_id: str, story_key: str, say: Callable[[str], None], *,
                   poll_s: float = 0.5, stop: threading.Event | None = None) -> bool:
    """Until the story starts, say what it waits for (again when that changes). False when it
    will not start without a person (the run settled first) or `stop` was set."""
    stop = stop or threading.Event()
    shown = None
    while True:
        line = not_started(reader, run_id, story_key)
        if line is None:
            return True
        if line != shown:
            say(line)
            shown = line
        with reader.session() as s:
            run = s.get(Run, run_id)
            if run.state in RUN_SETTLED:
                say(f"{story_key} has not started: run {run_id} is {run.state}"
                    + (f" ({run.reason})" if run.reason else ""))
                return False
        if stop.wait(poll_s):
            return False


def follow_log(reader, run_id: str, story_key: str, write: Callable[[str], None], *,
               follow: bool = True, from_first: bool = False,
               stop: threading.Event | None = None) -> None:
    """Print the story's session log (its current one; `from_first`: from its first, for an
    attach that waited for the story to start); with `follow`, keep printing as it grows, go on
    to each next session's log in turn when the story moves on (dev → review → fix: a session
    shorter than a poll is not skipped), and end once the story is no longer in flight and its
    last log is drained."""
    stop = stop or threading.Event()
    tail: LogTail | None = None
    first: int | None = None  # where following began, in the story's sessions
    while True:
        with reader.session() as s:
            row = next((st for st in stories_of(s, run_id) if st.key == story_key), None)
            run = s.get(Run, run_id)
            state = row.state if row else None
            logs = _session_logs(s, row)
            current = Path(row.log) if row and row.log else None
            run_settled = run is None or run.state in RUN_SETTLED
        if first is None and logs:
            at = _position(logs, current) if current and not from_first else 0
            first = at if at >= 0 else len(logs) - 1
        if first is not None:
            shown = _position(logs, tail.path) if tail is not None else first - 1
            for session, path in logs[shown + 1:]:  # each later session in turn
                if tail is not None:
                    tail.drain(write)
                tail = LogTail(path)
                write(f"==> {session or story_key}: {path} <==\n")
        if tail is not None:
            tail.drain(write)
        if not follow:
            if tail is None:
                write(f"{story_key}: no session log yet\n")
            return
        if state not in STORY_IN_FLIGHT or (run_settled and state != StoryState.WORKING):
            if tail is None:  # blocked or skipped before any session: say so, not nothing
                write(f"{story_key}: no session log ({state})\n")
            return
        if stop.wait(LOG_POLL_S):
            return


def _session_logs(s, row) -> list[tuple[str | None, Path]]:
    """The story's session logs in the order the sessions began (its current one last)."""
    if row is None:
        return []
    logs = [(session, Path(log)) for session, log in s.execute(
        select(Attempt.session, Attempt.log).where(Attempt.story_id == row.id, Attempt.log.is_not(None))
        .order_by(Attempt.id))]
    if row.log and all(path != Path(row.log) for _, path in logs):  # its attempt not written yet
        logs.append((row.session, Path(row.log)))
    return logs


def _position(logs, path: Path | None) -> int:
    """Where `path` is among the story's session logs (-1: not there)."""
    return next((i for i, (_, p) in enumerate(logs) if p == path), -1)


def live_tmux_session(reader, run_id: str, story_key: str) -> str | None:
    """The story's tmux session (`[adapter] tmux = true`) while it is alive, else None."""
    import shutil
    import subprocess

    from ..agents.tmux_session import TMUX

    with reader.session() as s:
        row = s.query(Story).filter(Story.run_id == run_id, Story.key == story_key).one()
        session = row.session
    if not session or "/" in session or not shutil.which("tmux"):
        return None
    if subprocess.run([*TMUX, "has-session", "-t", session], stdout=subprocess.DEVNULL,
                      stderr=subprocess.DEVNULL).returncode != 0:
        return None  # the session ended: its log is what there is
    return session


class LogTail:
    """Reads a growing file from where it stopped, decoding UTF-8 across read boundaries.

    A log at its cap (`logcap`) rolls: its tail moves down as its oldest part is dropped. The
    log's side file says by how much, so the reader moves with it; a read during which the
    tail moved is thrown away and made again at the next poll."""

    def __init__(self, path: Path):
        self.path = path
        self.offset = 0
        self.decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self.rolled = 0  # how far the tail had moved when last read
        self.marker_shown = False

    def drain(self, write: Callable[[str], None]) -> None:
        while True:
            cut = read_cut(self.path)
            if cut is not None and cut.moving:
                return  # a copy is under way: next poll
            if cut is not None:
                self._follow(cut, write)
            try:
                with open(self.path, "rb") as handle:
                    handle.seek(self.offset)
                    data = handle.read(_CHUNK)
            except FileNotFoundError:
                return
            if read_cut(self.path) != cut:
                return  # cut or rolled while reading: read again at the next poll
            self.offset += len(data)
            if cut is not None and self.offset > cut.marker_at:
                self.marker_shown, self.rolled = True, cut.rolled
            text = self.decoder.decode(data)
            if text:
                write(text)
            if len(data) < _CHUNK:
                return

    def _follow(self, cut: CutState, write: Callable[[str], None]) -> None:
        """Move with a cut made, or a tail rolled, since the last read."""
        if self.offset <= cut.marker_at:
            return  # the marker is ahead: it is read in its place
        if not self.marker_shown:  # cut after this reader passed the half: show the gap
            try:
                with open(self.path, "rb") as handle:
                    handle.seek(cut.marker_at)
                    write(handle.read(cut.tail - cut.marker_at).decode("utf-8", "replace"))
            except OSError:
                pass
            self.marker_shown = True
        position = max(self.offset, cut.tail) - (cut.rolled - self.rolled)
        if position < cut.tail:
            write(f"\n=== attach: {cut.tail - position} bytes rolled out of the log before they "
                  "were shown ===\n")
            position = cut.tail
        self.offset, self.rolled = position, cut.rolled
