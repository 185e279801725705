"""A stand-in `codex` (`codex exec --json`): see fakecli.py for the script.

Prints the exec JSONL events: `thread.started`, `turn.started`, `item.completed` (file changes,
the agent message) and `turn.completed` with `usage` (`input_tokens` including
`cached_input_tokens`, `output_tokens`; no cost). Faults: `usage-limit` — an `error` event and
`turn.failed` with "You've hit your usage limit. … try again at 3:28 PM.", exit 1.
"""

import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from fakecli import do_writes, emit, next_step, usage_of  # noqa: E402

FAULTS = {"usage-limit": "You've hit your usage limit. Visit https://chatgpt.com/codex/settings/usage "
                         "to purchase more credits or try again at 3:28 PM.",
          "rate-limit": "exceeded retry limit, last status: 429 Too Many Requests"}


def main() -> int:
    argv = sys.argv[1:]
    if argv == ["--version"]:  # as the real one prints it
        print("codex-cli " + os.environ.get("FAKE_CLI_VERSION", "0.171.0"))
        return 0
    if not argv or argv[0] != "exec":
        print("this stand-in only knows `codex exec`", file=sys.stderr)
        return 2
    json_mode = "--json" in argv
    step = next_step("codex")
    if json_mode:
        emit({"type": "thread.started", "thread_id": "fake"})
        emit({"type": "turn.started"})
    if step.get("fault"):
        words = step.get("words", FAULTS[step["fault"]])
        if json_mode:
            emit({"type": "error", "message": words})
            emit({"type": "turn.failed", "error": {"message": words}})
        else:
            print(f"ERROR: {words}", file=sys.stderr)
        return 1
    for n, rel in enumerate(do_writes(step)):
        if json_mode:
            emit({"type": "item.completed", "item": {"id": f"f{n}", "type": "file_change",
                                                     "changes": [{"path": rel, "kind": "add"}],
                                                     "status": "completed"}})
    say = step.get("say", "Done.")
    usage = usage_of(step)
    if json_mode:
        emit({"type": "item.completed", "item": {"id": "m", "type": "agent_message", "text": say}})
        emit({"type": "turn.completed", "usage": {"input_tokens": usage["input"] + usage["cache_read"],
                                                  "cached_input_tokens": usage["cache_read"],
                                                  "output_tokens": usage["output"]}})
    else:
        print(say)
    return int(step.get("exit", 0))


if __name__ == "__main__":
    sys.exit(main())
