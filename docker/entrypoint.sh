#!/bin/sh
# bmad-loop container entrypoint (tini runs it as PID 1's child).
#
#   bmad-loop-entrypoint init-repo      create the shared bare repository and checkout (repo-init)
#   bmad-loop-entrypoint healthcheck    exit 0 when the state database answers
#   bmad-loop-entrypoint CMD ARGS...    anything else runs as given, e.g. `bmad-loop worker ...`
set -eu

case "${1:-}" in
  init-repo)
    shift
    exec bmad-loop-init-repo "$@"
    ;;
  healthcheck)
    # Reads the runs through the same policy, database and migrations as the consumers.
    exec bmad-loop history --project "${BMAD_LOOP_PROJECT:-.}" --json >/dev/null
    ;;
  *)
    exec "$@"
    ;;
esac
