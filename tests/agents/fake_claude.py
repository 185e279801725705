"""A stand-in `claude` (Claude Code in print mode): see fakecli.py for the script.

Like the real one it refuses `--output-format stream-json` in print mode without `--verbose`,
then prints stream-json events: `system` init, `assistant` tool uses with their `user` tool
results, the final message, and the `result` event with `usage` and `total_cost_usd`. Faults as
Claude Code reports them: `rate-limit` exit 0 with `is_error` and "API Error: Rate limit reached";
`usage-limit` exit 1 with "You've hit your limit · resets 1pm"; `auth` exit 1, "Invalid API key ·
Please run /login".
"""

import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from fakecli import do_writes, emit, next_step, usage_of  # noqa: E402

FAULTS = {"rate-limit": (0, "API Error: Rate limit reached"),
          "usage-limit": (1, "You've hit your limit · resets 1pm"),
          "auth": (1, "Invalid API key · Please run /login")}


def main() -> int:
    argv = sys.argv[1:]
    if argv == ["--version"]:  # as the real one prints it
        print(os.environ.get("FAKE_CLI_VERSION", "2.1.332") + " (Claude Code)")
        return 0
    if "-p" not in argv and "--print" not in argv:
        print("this stand-in only knows print mode", file=sys.stderr)
        return 2
    if "stream-json" in argv and "--verbose" not in argv:
        print("Error: When using --print, --output-format=stream-json requires --verbose", file=sys.stderr)
        return 1
    step = next_step("claude")
    emit({"type": "system", "subtype": "init", "session_id": "fake", "model": "claude-sonnet",
          "tools": ["Bash", "Read", "Edit", "Write"], "permissionMode": "acceptEdits"})
    if step.get("fault"):
        code, words = FAULTS[step["fault"]]
        words = step.get("words", words)
        emit({"type": "result", "subtype": "success", "is_error": True, "result": words,
              "duration_ms": 40, "num_turns": 1, "session_id": "fake", "total_cost_usd": 0,
              "usage": {"input_tokens": 0, "output_tokens": 0}})
        return code
    for n, rel in enumerate(do_writes(step)):
        emit({"type": "assistant", "message": {"content": [
            {"type": "tool_use", "id": f"t{n}", "name": "Write", "input": {"file_path": rel}}]}})
        emit({"type": "user", "message": {"content": [
            {"type": "tool_result", "tool_use_id": f"t{n}", "content": "File written"}]}})
    say = step.get("say", "Done.")
    emit({"type": "assistant", "message": {"content": [{"type": "text", "text": say}]}})
    usage = usage_of(step)
    code = int(step.get("exit", 0))
    emit({"type": "result", "subtype": "success", "is_error": False, "result": say,
          "duration_ms": 1500, "num_turns": 3, "session_id": "fake",
          "total_cost_usd": usage["cost"],
          "usage": {"input_tokens": usage["input"], "output_tokens": usage["output"],
                    "cache_read_input_tokens": usage["cache_read"],
                    "cache_creation_input_tokens": usage["cache_write"]}})
    return code


if __name__ == "__main__":
    sys.exit(main())
