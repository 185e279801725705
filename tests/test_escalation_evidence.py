"""A story whose verify failed escalates with the agent's last output kept at
`refs/bmad-loop/verify/<run>/<story>`; the escalation line and `status` name it with the exact
commands to continue from it, and those commands, run as printed, lead to an integrated story.
The story branch is never moved by bmad-loop."""

import os
import shlex
import subprocess

from support import ALPHA_BETA, BAD_BETA_SCRIPT, REJECT_BAD_POLICY

BETA = "1-2-beta"


def _escalated(make_repo):
    repo = make_repo(ALPHA_BETA, script=BAD_BETA_SCRIPT, policy=REJECT_BAD_POLICY)
    result = repo.cli("run")
    assert result.exit_code == 3, result.output
    return repo, result.output


def test_the_escalation_line_and_status_name_the_kept_output_and_how_to_continue(make_repo):
    repo, output = _escalated(make_repo)
    run_id = repo.status()["run"]["id"]
    ref = f"refs/bmad-loop/verify/{run_id}/{BETA}"
    beta = repo.story(BETA)
    # The ref holds the agent's output; the branch still points where the worker left it.
    assert repo.git("show", f"{ref}:src/beta.py") == "bad"
    assert repo.git("rev-parse", beta["branch"]) == repo.git("rev-parse", f"{ref}^")
    lines = output.splitlines()
    at = next(i for i, line in enumerate(lines) if " story.escalated 1-2-beta" in line)
    told = "\n".join(lines[at + 1:at + 5])
    assert f"kept at {ref}" in told and f"checkout {ref} -- ." in told
    assert f"bmad-loop resume {run_id}" in told
    text = repo.cli("status").output
    assert f"kept at {ref}" in text and f"git -C {beta['worktree']} checkout {ref} -- ." in text
    assert beta["evidence_ref"] == ref
    assert beta["continue"][0] == f"git -C {beta['worktree']} checkout {ref} -- ."
    assert repo.story("1-1-alpha")["evidence_ref"] is None


def test_the_printed_commands_continue_from_the_kept_output_to_an_integrated_story(make_repo):
    repo, _ = _escalated(make_repo)
    beta = repo.story(BETA)
    checkout, commit, resume = beta["continue"]
    subprocess.run(shlex.split(checkout), check=True)
    with open(f"{beta['worktree']}/src/beta.py", "w") as fixed:  # the person's fix
        fixed.write("B = 1\n")
    person = {**os.environ, "GIT_AUTHOR_NAME": "A Person", "GIT_AUTHOR_EMAIL": "p@example.com",
              "GIT_COMMITTER_NAME": "A Person", "GIT_COMMITTER_EMAIL": "p@example.com"}
    subprocess.run(commit, shell=True, check=True, env=person)
    assert resume.startswith("bmad-loop resume ")
    result = repo.cli(*shlex.split(resume)[1:])
    assert result.exit_code == 0, result.output
    assert repo.story(BETA)["state"] == "integrated"
    assert repo.git("show", "main:src/beta.py") == "B = 1"
