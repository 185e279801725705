"""`[limits] max_log_bytes`: a session or verify log never grows past its cap, even while the
process prints. It keeps the output's first half exactly, a marker line at the gap and a rolling
last part that is the output's true tail; `attach` shows the marker; the journal notes the cut;
bmad-loop's memory does not grow with the output; a full disk drops output, never the run.

The printing processes are real (python writing numbered 64-byte lines), the disks real tmpfs
mounts where a test needs a small one.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from bmad_loop.agents.logcap import CappedLog, cut_marker, read_cut
from bmad_loop.operator.follow import LogTail
from support import StoryDef, barrier_script, build_repo, fill_disk, go, inside, run_agent, wait_until

CAP = 256 * 1024
LINE = 64


def numbered(first: int, count: int) -> bytes:
    """Lines `first`..`first + count - 1` as the scripted agent prints them (64 bytes each)."""
    return b"".join(f"line {n:058d}\n".encode() for n in range(first, first + count))


PRINTER = ("import sys\nout = sys.stdout.buffer\nn = 0\ntotal = int(sys.argv[1])\n"
           "while n * 64 < total:\n"
           "    out.write(b''.join(b'line %058d\\n' % i for i in range(n, n + 16384)))\n"
           "    n += 16384\n")


def print_argv(total: int) -> list[str]:
    return [sys.executable, "-c", PRINTER, str(total)]


def split_log(data: bytes, cap: int) -> tuple[bytes, bytes, bytes]:
    """(head, marker, tail) of a cut log."""
    marker = cut_marker(cap)
    at = data.index(marker)
    assert at == cap // 2
    return data[:at], marker, data[at + len(marker):]


def last_lines(data: bytes) -> list[bytes]:
    return data.rstrip(b"\n").split(b"\n")


def test_a_process_printing_far_past_the_cap_leaves_the_first_half_exact_a_marker_and_the_true_tail(tmp_path):
    log = tmp_path / "dev-1.log"
    total = 40 * 1024 * 1024  # 160 times the cap
    result = run_agent(print_argv(total), cwd=tmp_path, env=dict(os.environ), log_path=log,
                       timeout_s=120, label="printer", max_log_bytes=CAP)
    assert result.exit_code == 0
    data = log.read_bytes()
    assert len(data) <= CAP
    head, marker, tail = split_log(data, CAP)
    header = head.split(b"\n", 1)[0] + b"\n"
    assert header.startswith(b"=== bmad-loop printer started")
    stream = numbered(0, (CAP // 2) // LINE + 2)
    assert head == (header + stream)[:CAP // 2]  # the first half, byte for byte
    # After the marker: the output's last bytes, then the footer.
    body, footer = tail.rstrip(b"\n").rsplit(b"\n", 1)
    assert footer.startswith(b"=== bmad-loop printer exited 0")
    lines = total // LINE
    kept = body.split(b"\n")[1:]  # the first kept line may start mid-line
    assert len(kept) * LINE >= (CAP // 4) - 2 * LINE  # at least a quarter of the cap
    assert b"\n".join(kept) + b"\n" == numbered(lines - len(kept), len(kept))
    cut = read_cut(log)
    assert result.log_cut is not None and result.log_cut.dropped == cut.dropped > total - CAP
    assert len(data) - len(marker) + cut.dropped == len(header) + total + len(footer) + 1


@pytest.fixture
def small_disk(tmp_path):
    """A tmpfs of `size`, mounted for the test (root only: CI runs as root)."""
    mounts = []

    def mount(path: Path, size: str) -> Path:
        path.mkdir(parents=True, exist_ok=True)
        proc = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
                              capture_output=True, text=True)
        if proc.returncode != 0:
            if os.environ.get("CI"):
                pytest.fail(f"cannot mount a tmpfs in CI: {proc.stderr}")
            pytest.skip(f"cannot mount a tmpfs here: {proc.stderr.strip()}")
        mounts.append(path)
        return path

    yield mount
    for path in mounts:
        subprocess.run(["umount", "-l", str(path)], capture_output=True)


def test_the_log_stays_under_its_cap_on_disk_while_the_process_prints(tmp_path, small_disk):
    """On a disk only twice the cap, 40 MiB of output never fills it: the cap holds all along."""
    disk = small_disk(tmp_path / "disk", "512k")
    result = run_agent(print_argv(40 * 1024 * 1024), cwd=tmp_path, env=dict(os.environ),
                       log_path=disk / "verify.log", timeout_s=120, label="verify",
                       max_log_bytes=CAP)
    assert result.exit_code == 0
    assert result.log_cut.error is None and result.log_cut.lost == 0  # never a full disk
    assert (disk / "verify.log").stat().st_size <= CAP


def test_a_full_disk_drops_output_and_says_so_but_the_process_runs_to_its_end(tmp_path, small_disk):
    disk = small_disk(tmp_path / "disk", "128k")
    result = run_agent(print_argv(8 * 1024 * 1024), cwd=tmp_path, env=dict(os.environ),
                       log_path=disk / "dev-1.log", timeout_s=120, label="dev",
                       max_log_bytes=CAP)
    assert result.exit_code == 0  # the printer was never blocked nor broken
    cut = result.log_cut
    assert cut.error == "No space left on device" and cut.lost > 0
    data = (disk / "dev-1.log").read_bytes()
    assert data.startswith(b"=== bmad-loop dev started") and len(data) <= 128 * 1024


def test_a_follower_moves_with_the_rolling_tail_and_shows_the_marker(tmp_path):
    """Reads interleaved with writes at many points: the follower shows the head, the marker,
    then only real lines in order, ending on the file's own tail."""
    path = tmp_path / "dev-1.log"
    shown: list[str] = []
    follower = LogTail(path)
    n = 0
    with CappedLog(path, 64 * 1024) as log:
        for burst in [1, 3, 200, 7, 900, 5, 2000, 1, 4000, 50, 3]:
            log.write(numbered(n, burst))
            n += burst
            follower.drain(shown.append)
    follower.drain(shown.append)
    text = "".join(shown).encode()
    marker = cut_marker(64 * 1024)
    assert text.count(marker) == 1
    before, after = text.split(marker)
    assert before == numbered(0, 512)  # 32 KiB of 64-byte lines: the head, exact
    lines = [line for line in after.split(b"\n") if line.startswith(b"line ")]
    numbers = [int(line[5:]) for line in lines if len(line) == LINE - 1]
    assert numbers == sorted(numbers) and numbers[-1] == n - 1
    assert after.endswith(path.read_bytes().split(marker)[1][-4096:])


def test_a_run_cuts_session_and_verify_logs_journals_it_and_attach_shows_the_marker(make_repo):
    story = StoryDef("1-1-alpha", files=["src/alpha.py"])
    script = {story.key: {"dev": [{"write": {"src/alpha.py": "A = 1\n"}, "print_bytes": 8 << 20}]}}
    repo = make_repo([story], script=script, policy=(
        '[gates]\nmode = "none"\n[review]\nenabled = false\n'
        f"[limits]\nmax_log_bytes = {CAP}\n"
        f'[verify]\ncommands = ["{sys.executable} -c \\"{_VERIFY_PRINT}\\""]\n'))
    assert repo.cli("run").exit_code == 0
    cuts = [e for e in repo.journal() if e["kind"] == "log.truncated"]
    assert [(e["story"], e["data"]["phase"]) for e in cuts] == [
        (story.key, "dev"), (story.key, "candidate verify")]
    assert all(e["data"]["dropped_bytes"] > 1 << 20 and e["data"]["max_log_bytes"] == CAP for e in cuts)
    verify = [e for e in repo.journal() if e["kind"] == "verify.passed"]
    assert verify[0]["data"]["log_truncated"]["dropped_bytes"] > 1 << 20
    logs = sorted((repo.root / ".bmad-loop" / "logs").rglob("*.log"))
    assert logs and all(p.stat().st_size <= CAP for p in logs)
    attached = repo.cli("attach", story.key, "--no-follow")
    assert attached.exit_code == 0
    assert cut_marker(CAP).decode() in attached.output
    assert f"line {(8 << 20) // LINE - 1:058d}\n" in attached.output  # the true last line


_VERIFY_PRINT = ("import sys; [sys.stdout.write('v' * 63 + chr(10)) for _ in range(40000)]")


def test_a_disk_that_fills_while_an_agent_prints_is_journaled_and_resume_completes(make_repo, tmp_path,
                                                                                   small_disk, bar):
    """The repository on a 24 MB tmpfs, filled while the agent waits at its barrier; then it
    prints 20 MiB. The log keeps what fit, `log.truncated` names the error, the run pauses on
    its next write of its own (or completes), and once space is freed `resume` integrates."""
    disk = small_disk(tmp_path / "disk", "24m")
    story = StoryDef("1-1-alpha", files=["src/alpha.py"])
    script = barrier_script([story], bar, extra={story.key: {"print_bytes": 20 << 20}})
    db = tmp_path / "state" / "state.db"
    db.parent.mkdir()
    repo = build_repo(disk, [story], script=script, policy=(
        '[gates]\nmode = "none"\n[review]\nenabled = false\n'
        f'[database]\nurl = "sqlite:///{db}"\n[queue]\nurl = "{db.parent / "queue.db"}"\n'))
    try:
        proc = repo.spawn("run")
        wait_until(lambda: story.key in inside(bar), what="the agent inside dev")
        filler = fill_disk(disk)
        go(bar, story.key)
        assert proc.wait(timeout=300) in (0, 3), repo.spawned_logs()
        cuts = [e["data"] for e in repo.journal() if e["kind"] == "log.truncated"]
        assert cuts and cuts[0]["phase"] == "dev" and cuts[0]["error"] == "No space left on device"
        assert cuts[0]["lost_bytes"] > 0
        filler.unlink()
        if repo.status()["run"]["state"] == "paused":
            assert repo.cli("resume").exit_code == 0
        assert repo.story(story.key)["state"] == "integrated"
    finally:
        repo.kill_spawned()
