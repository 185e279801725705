"""The thaw helper, with real processes: a child Python process (the stand-in for bmad-loop) opens
and closes steps on command, and the test stops it, kills it or kills its helper.

The child reads one command a line on stdin and answers each with one line on stdout: the pid of
its helper (`thaw.helper_pid()`) once the command is done. That answer is the barrier: the child
wrote its open or close into the helper's pipe before it answered.
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest

from support import alive, wait_until

DRIVER = textwrap.dedent("""\
    import json, sys, threading
    from bmad_loop.agents import thaw

    guards = {}
    for line in sys.stdin:
        command, *args = line.split()
        if command == "open":
            guards[args[0]] = thaw.guard(float(args[1]), args[2] if len(args) > 2 else None)
        elif command == "close":
            guards.pop(args[0]).close()
        elif command == "threads":  # steps opened at once by many threads, none open before
            barrier = threading.Barrier(int(args[0]))
            seen = set()
            def step():
                barrier.wait()
                with thaw.guard(60.0, None):
                    seen.add(thaw.helper_pid())
            threads = [threading.Thread(target=step) for _ in range(int(args[0]))]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
            print(json.dumps(sorted(seen)), flush=True)
            continue
        print(thaw.helper_pid(), flush=True)
""")

AFTER_S = 0.3
NOTE_LINE = "was stopped for"


class Driver:
    def __init__(self, tmp_path: Path) -> None:
        script = tmp_path / "driver.py"
        script.write_text(DRIVER)
        env = {k: v for k, v in os.environ.items() if not k.startswith("BMAD_LOOP_")}
        self.proc = subprocess.Popen([sys.executable, str(script)], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True, env=env)
        self.helpers: set[int] = set()

    def ask(self, command: str, timeout_s: float = 20.0) -> str:
        self.proc.stdin.write(command + "\n")
        self.proc.stdin.flush()
        readable, _, _ = select.select([self.proc.stdout], [], [], timeout_s)
        assert readable, f"the driver did not answer {command!r}"
        answer = self.proc.stdout.readline().strip()
        assert answer, f"the driver died on {command!r}"
        return answer

    def step(self, command: str) -> int:
        """Run `command`; the pid of the helper afterwards."""
        pid = int(self.ask(command))
        self.helpers.add(pid)
        return pid

    def status(self) -> str:
        return psutil.Process(self.proc.pid).status()

    def stop(self) -> None:
        os.kill(self.proc.pid, signal.SIGSTOP)
        wait_until(lambda: self.status() == psutil.STATUS_STOPPED, timeout=10, what="stopped")

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        for pid in self.helpers:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


@pytest.fixture
def driver(tmp_path):
    made = Driver(tmp_path)
    yield made
    made.close()


def thaw_children(pid: int) -> list[psutil.Process]:
    """The children of the driver `pid`, zombies included: it starts nothing but helpers.
    (Not told apart by their command line: just after exec, it can still read empty.)"""
    return psutil.Process(pid).children()


def test_a_process_stopped_while_a_step_is_open_is_continued_and_the_note_says_so(driver, tmp_path):
    note = tmp_path / "session.log"
    driver.step(f"open a {AFTER_S} {note}")
    stopped_at = time.monotonic()
    driver.stop()
    wait_until(lambda: driver.status() != psutil.STATUS_STOPPED, timeout=10,
               what="the helper's SIGCONT")
    assert time.monotonic() - stopped_at >= AFTER_S
    text = wait_until(lambda: note.exists() and note.read_text(), timeout=10, what="the note")
    assert f"(pid {driver.proc.pid}) {NOTE_LINE}" in text and "continued (SIGCONT)" in text
    driver.step("close a")  # the continued process works on


def test_with_no_step_open_a_stop_is_left_alone_and_the_helper_sleeps(driver, tmp_path):
    first_note, note = tmp_path / "first.log", tmp_path / "session.log"
    helper = driver.step(f"open a {AFTER_S} {first_note}")
    driver.stop()  # barrier: once the process is continued, the helper is at work
    wait_until(lambda: driver.status() != psutil.STATUS_STOPPED, timeout=10, what="SIGCONT")
    assert driver.step("close a") == helper  # the close is in the pipe before the stop
    driver.stop()  # a user's Ctrl+Z between steps
    handle = psutil.Process(helper)
    time.sleep(AFTER_S)  # let the helper take in the close; a polling helper would show below
    switches = handle.num_ctx_switches().voluntary  # a polling helper sleeps ten times a second
    # A negative cannot be waited for: five times `after_s` is long past when a helper that
    # ignored the close would have continued the process.
    time.sleep(5 * AFTER_S)
    assert driver.status() == psutil.STATUS_STOPPED
    assert handle.num_ctx_switches().voluntary - switches <= 1  # blocked on its pipe
    # The same helper still acts once a step is open again.
    os.kill(driver.proc.pid, signal.SIGCONT)
    assert driver.step(f"open b {AFTER_S} {note}") == helper
    driver.stop()
    wait_until(lambda: driver.status() != psutil.STATUS_STOPPED, timeout=10, what="SIGCONT")
    wait_until(lambda: note.exists() and NOTE_LINE in note.read_text(), timeout=10, what="note")


def test_steps_of_one_process_share_one_helper(driver, tmp_path):
    # Many threads open the process's first steps at once: still one helper.
    seen = json.loads(driver.ask("threads 8"))
    first = thaw_children(driver.proc.pid)
    assert len(first) == 1 and seen == [first[0].pid]
    helper = first[0].pid
    assert driver.step(f"open a {AFTER_S} {tmp_path / 'a.log'}") == helper
    assert driver.step(f"open b 60 {tmp_path / 'b.log'}") == helper
    assert driver.step("close a") == helper
    assert driver.step("close b") == helper
    assert driver.step(f"open c {AFTER_S} {tmp_path / 'c.log'}") == helper
    assert [c.pid for c in thaw_children(driver.proc.pid)] == [helper]


def test_a_killed_helper_is_reaped_and_replaced_at_the_next_open(driver, tmp_path):
    first_note, second_note = tmp_path / "a.log", tmp_path / "b.log"
    first = driver.step(f"open a 60 {first_note}")  # open while its helper is killed
    os.kill(first, signal.SIGKILL)
    wait_until(lambda: not alive(first), timeout=10, what="the helper's death")
    second = driver.step(f"open b {AFTER_S} {second_note}")
    assert second != first
    assert [c.pid for c in thaw_children(driver.proc.pid)] == [second]  # the dead one reaped
    driver.stop()
    wait_until(lambda: driver.status() != psutil.STATUS_STOPPED, timeout=10, what="SIGCONT")
    # The replacement was told of the step still open from before: both notes get the line.
    for note in (first_note, second_note):
        wait_until(lambda: note.exists() and NOTE_LINE in note.read_text(), timeout=10,
                   what=f"the line in {note.name}")


def test_a_stopped_helper_is_replaced_at_the_next_open(driver, tmp_path):
    first = driver.step(f"open a {AFTER_S} {tmp_path / 'a.log'}")
    os.kill(first, signal.SIGSTOP)  # a step that froze the helper cannot leave us unguarded
    wait_until(lambda: psutil.Process(first).status() == psutil.STATUS_STOPPED, timeout=10,
               what="the helper stopped")
    second = driver.step(f"open b {AFTER_S} {tmp_path / 'b.log'}")
    assert second != first and not alive(first)
    driver.stop()
    wait_until(lambda: driver.status() != psutil.STATUS_STOPPED, timeout=10, what="SIGCONT")


@pytest.mark.parametrize("step_open", [True, False], ids=["step-open", "idle"])
def test_the_helper_exits_when_its_process_dies(driver, tmp_path, step_open):
    helper = driver.step(f"open a {AFTER_S} {tmp_path / 'a.log'}")
    driver.stop()  # barrier: once the process is continued, the helper is at work
    wait_until(lambda: driver.status() != psutil.STATUS_STOPPED, timeout=10, what="SIGCONT")
    if not step_open:
        driver.step("close a")
    driver.proc.kill()
    driver.proc.wait()
    wait_until(lambda: not alive(helper), timeout=10, what="the helper's exit")
