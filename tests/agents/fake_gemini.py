"""A stand-in `gemini` (headless, `-o stream-json`): see fakecli.py for the script.

Like the real one (folders untrusted by default), it refuses to run unless
`GEMINI_CLI_TRUST_WORKSPACE=true`: FatalUntrustedWorkspaceError, exit 55. Then it prints the
stream-json events: `init`, `tool_use`/`tool_result`, assistant `message` chunks, and `result`
with `stats` (`input_tokens` including `cached`, `input`, `output_tokens`; no cost). Faults:
`rate-limit` — a `result` with `status: error` and a RetryableQuotaError "Please retry in 20s",
exit 1.
"""

import sys
import os
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from fakecli import do_writes, emit, next_step, usage_of  # noqa: E402

FAULTS = {"rate-limit": ("RetryableQuotaError", "Resource exhausted. Please retry in 20s."),
          "usage-limit": ("TerminalQuotaError", "You have exhausted your daily quota.")}


def main() -> int:
    argv = sys.argv[1:]
    if argv == ["--version"]:  # as the real one prints it
        print(os.environ.get("FAKE_CLI_VERSION", "0.61.0"))
        return 0
    step = next_step("gemini")
    if os.environ.get("GEMINI_CLI_TRUST_WORKSPACE") != "true":
        print("FatalUntrustedWorkspaceError: Gemini CLI is not running in a trusted directory. "
              "To proceed, use --skip-trust or set GEMINI_CLI_TRUST_WORKSPACE=true.", file=sys.stderr)
        return 55
    stream = "stream-json" in argv
    if stream:
        emit({"type": "init", "timestamp": "t", "session_id": "fake", "model": "gemini-pro"})
    if step.get("fault"):
        kind, words = FAULTS[step["fault"]]
        if stream:
            emit({"type": "result", "timestamp": "t", "status": "error",
                  "error": {"type": kind, "message": step.get("words", words)}})
        return 1
    for n, rel in enumerate(do_writes(step)):
        if stream:
            emit({"type": "tool_use", "timestamp": "t", "tool_name": "write_file", "tool_id": f"w{n}",
                  "parameters": {"file_path": rel}})
            emit({"type": "tool_result", "timestamp": "t", "tool_id": f"w{n}", "status": "success"})
    say = step.get("say", "Done.")
    usage = usage_of(step)
    if stream:
        for chunk in (say[: len(say) // 2], say[len(say) // 2:]):
            emit({"type": "message", "timestamp": "t", "role": "assistant", "content": chunk, "delta": True})
        total_in = usage["input"] + usage["cache_read"]
        emit({"type": "result", "timestamp": "t", "status": "success",
              "stats": {"total_tokens": total_in + usage["output"], "input_tokens": total_in,
                        "output_tokens": usage["output"], "cached": usage["cache_read"],
                        "input": usage["input"], "duration_ms": 900, "tool_calls": 1}})
    else:
        print(say)
    return int(step.get("exit", 0))


if __name__ == "__main__":
    sys.exit(main())
