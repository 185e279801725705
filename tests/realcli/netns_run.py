"""Run bmad-loop commands beside the fake model server, inside a loopback-only network namespace.

Started by a test as `unshare -n python netns_run.py JOB.json` (as root; `unshare -rn` otherwise):
the new namespace has only `lo`, down. This brings `lo` up, starts the fake model server and the
counting proxy on their fixed ports (the namespace is private, so fixed ports never collide), then
runs each step of the job in turn — set the server's scenario, run the step's argv — and writes
what happened (exit codes, output tails, durations, the server's and the proxy's counts) to the
job's result file. Nothing started here can reach any address but 127.0.0.1.

JOB: {"model_port": int, "proxy_port": int, "result": path,
      "steps": [{"argv": [...], "env": {...}, "scenario": {...}, "timeout": s}]}
"""

from __future__ import annotations

import fcntl
import json
import socket
import struct
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from fakemodel import CountingProxy, FakeModel, Scenario  # noqa: E402

_SIOCGIFFLAGS, _SIOCSIFFLAGS, _IFF_UP = 0x8913, 0x8914, 0x1


def loopback_up() -> None:
    """`ip link set lo up`, without needing iproute2."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        request = struct.pack("16sH22x", b"lo", 0)
        flags = struct.unpack("16sH22x", fcntl.ioctl(sock, _SIOCGIFFLAGS, request))[1]
        fcntl.ioctl(sock, _SIOCSIFFLAGS, struct.pack("16sH22x", b"lo", flags | _IFF_UP))


def main(job_path: str) -> int:
    job = json.loads(Path(job_path).read_text())
    loopback_up()
    model = FakeModel(port=job["model_port"]).start()
    proxy = CountingProxy(port=job["proxy_port"]).start()
    results = []
    try:
        for step in job["steps"]:
            model.set_scenario(Scenario(**step.get("scenario", {})))
            started = time.monotonic()
            try:
                done = subprocess.run(step["argv"], env=step["env"], cwd=step.get("cwd"),
                                      stdin=subprocess.DEVNULL, capture_output=True, text=True,
                                      timeout=step.get("timeout", 600))
                rc, out = done.returncode, done.stdout + done.stderr
            except subprocess.TimeoutExpired as exc:
                rc, out = None, f"timed out: {exc}"
            results.append({"rc": rc, "output": out[-6000:],
                            "seconds": round(time.monotonic() - started, 2)})
    finally:
        report = {"steps": results, "model": model.report(), "proxy": list(proxy.attempts)}
        Path(job["result"]).write_text(json.dumps(report, indent=1))
        model.stop()
        proxy.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
