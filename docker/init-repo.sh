#!/bin/sh
# Create, once, the shared bare repository the consumers clone and the operator's checkout.
#
#   BMAD_REMOTE_DIR    the bare repository (a named volume)        [/srv/remote/project.git]
#   BMAD_LOOP_PROJECT  the operator's checkout (a named volume)    [/srv/project]
#   BMAD_SEED_DIR      a git repository to start from (bind mount) [/seed]; when it holds no
#                      repository, bmad-loop's demo sprint is generated instead
#
# Idempotent: an existing bare repository or checkout is left as it is, so re-running
# `docker compose up` never loses work. Every consumer works in its own clone of the bare
# repository (remote mode); the checkout is where the operator plans runs and reads status.
set -eu

remote="${BMAD_REMOTE_DIR:-/srv/remote/project.git}"
checkout="${BMAD_LOOP_PROJECT:-/srv/project}"
seed="${BMAD_SEED_DIR:-/seed}"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

# The seed is usually a bind mount owned by another uid: trust it for reading only. Only the
# seed folder itself counts: git must not find a repository in a folder above it.
git_seed() {
  GIT_CEILING_DIRECTORIES="$(dirname "$seed")" \
    git -c safe.directory="$seed" -c safe.directory="$seed/.git" "$@"
}

policy_source=""
if git --git-dir="$remote" rev-parse --git-dir >/dev/null 2>&1; then
  echo "repo-init: bare repository $remote exists; left as it is"
else
  mkdir -p "$(dirname "$remote")"
  if [ -d "$seed" ] && git_seed -C "$seed" rev-parse --git-dir >/dev/null 2>&1; then
    echo "repo-init: cloning $seed into $remote"
    git_seed clone --quiet --bare "$seed" "$remote"
    policy_source="$seed/.bmad-loop/policy.toml"
  else
    echo "repo-init: no repository in $seed; generating the demo sprint"
    python -c 'import sys; from pathlib import Path; from bmad_loop.cli.demo import build_demo_repo; build_demo_repo(Path(sys.argv[1]))' "$work/demo"
    git clone --quiet --bare "$work/demo" "$remote"
    policy_source="$work/demo/.bmad-loop/policy.toml"
  fi
fi

if [ -e "$checkout/.git" ]; then
  echo "repo-init: checkout $checkout exists; left as it is"
else
  mkdir -p "$checkout"
  echo "repo-init: cloning $remote into $checkout"
  git clone --quiet "$remote" "$checkout"
  # A policy the seed keeps uncommitted (the demo's is git-ignored) comes along once.
  if [ -n "$policy_source" ] && [ -f "$policy_source" ] && [ ! -f "$checkout/.bmad-loop/policy.toml" ]; then
    mkdir -p "$checkout/.bmad-loop"
    cp "$policy_source" "$checkout/.bmad-loop/policy.toml"
    echo "repo-init: copied $policy_source"
  fi
fi
echo "repo-init: ready: $checkout on branch $(git -C "$checkout" rev-parse --abbrev-ref HEAD)"
