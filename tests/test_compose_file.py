"""docker-compose.yml and docker/ checked without a Docker engine (this machine cannot run one).

What can be proven here is proven for real: the YAML parses; the services are the five the
docs name; every command and option they run is a real `bmad-loop` command (asked of the
click objects, not of a copy of the help text); every BMAD_LOOP_* variable is a real policy key
and the policy loads with them (remote mode on the shared bare repository); the URLs name the
compose services; every consumer works in a clone of its own and mounts the bare repository;
only the lane mounts the operator's checkout; the Dockerfile ships what the compose file
calls; the container scripts are valid shell, and `init-repo` really builds the shared
repositories. The last test runs the compose topology itself — repo-init, then the lane's and
the worker's exact commands as processes — against the loopback Redis and PostgreSQL.
"""

from __future__ import annotations

import dataclasses
import os
import re
import shlex
import signal
import subprocess
import sys
import tomllib
from pathlib import Path, PurePosixPath

import click
import pytest
import yaml
from sqlalchemy.engine import make_url

from bmad_loop import policy as policy_module
from bmad_loop.cli import cli
from support import SETTLED, init_repo, wait_until

ROOT = Path(__file__).resolve().parents[1]
COMPOSE = ROOT / "docker-compose.yml"
DOCKER = ROOT / "docker"
ENTRYPOINT = DOCKER / "entrypoint.sh"
INIT_REPO = DOCKER / "init-repo.sh"
DOCKERFILE = DOCKER / "Dockerfile"
SERVICES = {"redis", "postgres", "repo-init", "lane", "worker"}
BMAD_SERVICES = ("repo-init", "lane", "worker")
CONSUMERS = ("lane", "worker")
PROJECT_VAR = "BMAD_LOOP_PROJECT"  # click's envvar for --project, not a policy key


def _interpolate(value):
    """Compose's `${NAME:-default}` with NAME unset, as on a fresh `docker compose up`."""
    if isinstance(value, str):
        def default(match):
            if match.group(2) is None:
                raise AssertionError(f"{match.group(0)} has no default: `up` would need it set")
            return match.group(2)
        return re.sub(r"\$\{(\w+)(?::-([^}]*))?\}", default, value)
    if isinstance(value, list):
        return [_interpolate(v) for v in value]
    if isinstance(value, dict):
        return {k: _interpolate(v) for k, v in value.items()}
    return value


@pytest.fixture(scope="module")
def compose() -> dict:
    return _interpolate(yaml.safe_load(COMPOSE.read_text()))


def _service(compose, name) -> dict:
    return compose["services"][name]


def _environment(service: dict) -> dict[str, str]:
    env = service.get("environment") or {}
    if isinstance(env, list):  # the KEY=VALUE list form
        env = dict(item.split("=", 1) for item in env)
    return {k: "" if v is None else str(v) for k, v in env.items()}


def _mounts(service: dict) -> dict[str, tuple[str, str]]:
    """target path -> (source, mode) for every short-syntax volume."""
    out = {}
    for entry in service.get("volumes", []):
        parts = entry.split(":")
        source, target = parts[0], parts[1]
        out[target] = (source, parts[2] if len(parts) > 2 else "rw")
    return out


def _bmad_command(argv: list[str]) -> click.Context:
    """Parse `bmad-loop SUB ARGS…` with the real click command: unknown options, bad choices
    and bad types fail here exactly as they would in the container."""
    assert argv[0] == "bmad-loop", argv
    command = cli.commands.get(argv[1])
    assert command is not None, f"bmad-loop has no command {argv[1]!r} (has {sorted(cli.commands)})"
    return command.make_context(f"bmad-loop {argv[1]}", list(argv[2:]))


def _entrypoint_subcommands() -> set[str]:
    labels = re.findall(r"^\s*([a-z][a-z-]*)\)\s*$", ENTRYPOINT.read_text(), re.M)
    return set(labels)


def _bmad_invocations(script: Path) -> list[list[str]]:
    """`bmad-loop SUB --opt …` lines inside a shell script, as argv (variables left as words)."""
    out = []
    for line in script.read_text().splitlines():
        match = re.search(r"(?:exec\s+)?\bbmad-loop\s+([a-z][a-z-]*(?:\s+[^>|;&]*)?)", line)
        if match and not line.lstrip().startswith("#"):
            words = match.group(1).split()
            out.append(["bmad-loop", *[w.strip('"') for w in words]])
    return out


# --- services and commands -----------------------------------------------------------------


def test_the_compose_file_has_the_five_services_the_docs_name(compose):
    assert set(compose["services"]) == SERVICES
    assert "version" not in compose  # the compose specification dropped it


def test_the_lane_runs_the_integration_queue_on_one_thread_and_one_replica(compose):
    lane = _service(compose, "lane")
    ctx = _bmad_command(lane["command"])
    assert ctx.command.name == "worker"
    assert ctx.params["queue"] == "integration"
    assert ctx.params["workers"] in (None, 1)  # -w N > 1 is exit 2 for the lane
    assert lane.get("deploy", {}).get("replicas", 1) == 1
    assert "scale" not in lane


def test_the_scalable_worker_runs_the_stories_queue_with_two_threads(compose):
    worker = _service(compose, "worker")
    ctx = _bmad_command(worker["command"])
    assert ctx.command.name == "worker"
    assert (ctx.params["queue"], ctx.params["workers"]) == ("stories", 2)
    assert "container_name" not in worker  # a fixed name would make --scale impossible
    assert "ports" not in worker


def test_a_bad_option_would_be_caught_by_the_same_parsing():
    with pytest.raises(click.UsageError):
        _bmad_command(["bmad-loop", "worker", "--queue", "story"])
    with pytest.raises(click.UsageError):
        _bmad_command(["bmad-loop", "worker", "--no-such-option"])


def test_repo_init_and_the_healthchecks_use_real_entrypoint_subcommands(compose):
    subcommands = _entrypoint_subcommands()
    assert {"init-repo", "healthcheck"} <= subcommands
    assert _service(compose, "repo-init")["command"][0] in subcommands
    for name in CONSUMERS:
        test = _service(compose, name)["healthcheck"]["test"]
        assert test[0] == "CMD" and test[1] == "bmad-loop-entrypoint" and test[2] in subcommands
    for name in ("redis", "postgres"):
        assert _service(compose, name)["healthcheck"]["test"][0] in ("CMD", "CMD-SHELL")


def test_every_bmad_loop_call_inside_the_container_scripts_is_a_real_command():
    calls = _bmad_invocations(ENTRYPOINT) + _bmad_invocations(INIT_REPO)
    assert calls, "the scripts call bmad-loop somewhere (the healthcheck at least)"
    for argv in calls:
        command = cli.commands.get(argv[1])
        assert command is not None, argv
        opts = {opt for param in command.params for opt in param.opts}
        for word in argv[2:]:
            if word.startswith("-"):
                assert word in opts, f"{argv}: bmad-loop {argv[1]} has no option {word}"


def _doc_commands() -> list[list[str]]:
    """Every `bmad-loop …` call in the sh blocks of docs/scale-out.md, as argv."""
    text = (ROOT / "docs" / "scale-out.md").read_text()
    calls = []
    for block in re.findall(r"```sh\n(.*?)```", text, re.S):
        for line in block.splitlines():
            line = re.sub(r"\s#.*$", "", line).rstrip(" &")
            if "bmad-loop " in line and not line.lstrip().startswith("#"):
                calls.append(["bmad-loop", *shlex.split(line.split("bmad-loop ", 1)[1])])
    return calls


def test_every_bmad_loop_command_in_docs_scale_out_md_parses():
    calls = _doc_commands()
    assert len(calls) >= 15, calls
    for argv in calls:
        _bmad_command(argv)


# --- environment and policy ----------------------------------------------------------------


def test_every_bmad_loop_variable_is_a_real_policy_key_or_the_project_option(compose):
    project_option = next(p for p in cli.commands["worker"].params if p.name == "project_dir")
    assert project_option.envvar == PROJECT_VAR
    for name in CONSUMERS:
        for var in _environment(_service(compose, name)):
            if not var.startswith(policy_module.ENV_PREFIX) or var == PROJECT_VAR:
                continue
            rest = var[len(policy_module.ENV_PREFIX):]
            section = next((s for s in policy_module.SECTIONS if rest.startswith(s.upper() + "_")), None)
            assert section is not None, f"{name}: {var} names no policy section (it would be ignored)"
            key = rest[len(section) + 1:].lower()
            keys = {f.name for f in dataclasses.fields(getattr(policy_module.Policy(), section))}
            assert key in keys, f"{name}: {var}: [{section}] has no key {key!r}"


def test_the_policy_loads_with_the_consumer_environment_and_means_redis_and_postgres(compose, tmp_path):
    for name in CONSUMERS:
        env = _environment(_service(compose, name))
        loaded = policy_module.load_policy(tmp_path, env=env)  # raises ConfigError on any bad one
        assert loaded.queue.backend == "redis"
        assert loaded.queue.url == env["BMAD_LOOP_QUEUE_URL"]
        assert loaded.database.url == env["BMAD_LOOP_DATABASE_URL"]
        # Remote mode, on the bare repository repo-init makes.
        assert loaded.scm.remote == _environment(_service(compose, "repo-init"))["BMAD_REMOTE_DIR"]


def test_lane_and_worker_share_one_environment_but_only_the_lane_names_a_checkout(compose):
    lane = _environment(_service(compose, "lane"))
    worker = _environment(_service(compose, "worker"))
    assert PROJECT_VAR in lane and PROJECT_VAR not in worker
    del lane[PROJECT_VAR]
    assert lane == worker


def test_every_consumer_works_in_a_clone_of_its_own(compose):
    for name in CONSUMERS:
        ctx = _bmad_command(_service(compose, name)["command"])
        clone = ctx.params["clone_dir"]
        assert clone is not None, f"{name}: no --clone (remote mode needs one per consumer)"
        # Inside the container's own filesystem: not a volume another replica could share.
        assert not any(PurePosixPath(str(clone)).is_relative_to(target)
                       for target in _mounts(_service(compose, name))), name


def test_the_urls_name_the_compose_services_and_their_credentials(compose):
    env = _environment(_service(compose, "lane"))
    redis_url = make_url(env["BMAD_LOOP_QUEUE_URL"].replace("redis://", "redis+x://"))
    assert redis_url.host == "redis" and (redis_url.port or 6379) == 6379
    database = make_url(env["BMAD_LOOP_DATABASE_URL"])
    assert database.drivername == "postgresql+psycopg"
    assert database.host == "postgres" and (database.port or 5432) == 5432
    pg_env = _environment(_service(compose, "postgres"))
    assert (database.username, database.password, database.database) == (
        pg_env["POSTGRES_USER"], pg_env["POSTGRES_PASSWORD"], pg_env["POSTGRES_DB"])


def test_the_consumers_wait_for_healthy_services_and_an_initialised_repository(compose):
    for name in CONSUMERS:
        depends = _service(compose, name)["depends_on"]
        assert depends == {"redis": {"condition": "service_healthy"},
                           "postgres": {"condition": "service_healthy"},
                           "repo-init": {"condition": "service_completed_successfully"}}
    assert _service(compose, "repo-init").get("restart") == "no"


# --- volumes -------------------------------------------------------------------------------


def test_the_lane_mounts_the_checkout_repo_init_made_and_workers_need_none(compose):
    declared = set(compose["volumes"])
    project_path = _environment(_service(compose, "lane"))[PROJECT_VAR]
    sources = set()
    for name in ("lane", "repo-init"):
        service = _service(compose, name)
        assert _environment(service)[PROJECT_VAR] == project_path
        source, mode = _mounts(service)[project_path]
        assert source in declared and mode == "rw", (name, source, mode)
        sources.add(source)
    assert len(sources) == 1, f"one checkout volume, got {sources}"
    worker_sources = {source for source, _ in _mounts(_service(compose, "worker")).values()}
    assert not worker_sources & sources  # "a container needs no checkout of its own"


def test_repo_init_creates_the_shared_bare_repository_in_a_named_volume_the_consumers_mount(compose):
    declared = set(compose["volumes"])
    init = _service(compose, "repo-init")
    remote_dir = PurePosixPath(_environment(init)["BMAD_REMOTE_DIR"])
    mounts = _mounts(init)
    volume_of_remote = next(src for target, (src, _) in mounts.items()
                            if remote_dir.is_relative_to(target))
    assert volume_of_remote in declared
    for name in CONSUMERS:
        assert (volume_of_remote, "rw") in _mounts(_service(compose, name)).values()
    seed_source, seed_mode = mounts[_environment(init)["BMAD_SEED_DIR"]]
    assert seed_mode == "ro"
    assert (ROOT / seed_source).is_dir()  # the default seed (no repository: the demo)


# --- the image -----------------------------------------------------------------------------


def _dockerfile_instructions() -> list[tuple[str, str]]:
    text = DOCKERFILE.read_text().replace("\\\n", " ")
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            out.append((word.upper(), rest.strip()))
    return out


def test_the_dockerfile_builds_from_sources_that_exist_and_installs_the_scale_out_extras(compose):
    for name in BMAD_SERVICES:
        build = _service(compose, name)["build"]
        assert (ROOT / build["context"] / build["dockerfile"]).resolve() == DOCKERFILE
    instructions = _dockerfile_instructions()
    for word, rest in instructions:
        if word == "COPY":
            *sources, _dest = rest.split()
            for source in sources:
                assert (ROOT / source).exists(), f"COPY {source}: not in the build context"
    pip = " ".join(rest for word, rest in instructions if word == "RUN" and "pip install" in rest)
    extras = re.search(r'"\.\[([a-z,]+)\]"', pip)
    assert extras, f"the package itself is pip-installed with extras: {pip!r}"
    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert {"redis", "postgres"} <= set(extras.group(1).split(",")) <= set(declared)


def test_the_image_ships_the_entrypoint_the_compose_file_calls(compose):
    instructions = _dockerfile_instructions()
    copies = {rest.split()[-1]: rest.split()[0] for word, rest in instructions if word == "COPY"}
    assert copies["/usr/local/bin/bmad-loop-entrypoint"] == "docker/entrypoint.sh"
    assert copies["/usr/local/bin/bmad-loop-init-repo"] == "docker/init-repo.sh"
    entrypoint = next(rest for word, rest in instructions if word == "ENTRYPOINT")
    assert "bmad-loop-entrypoint" in entrypoint and "tini" in entrypoint
    env = " ".join(rest for word, rest in instructions if word == "ENV")
    # The image names no checkout: a worker container has none (the lane's comes from compose).
    assert PROJECT_VAR not in env
    workdirs = [rest for word, rest in instructions if word == "RUN" and "/var/lib/bmad-loop" in rest]
    assert workdirs, "the image makes the folder the consumers' clones live in"
    assert "BMAD_REMOTE_DIR=" + _environment(_service(compose, "repo-init"))["BMAD_REMOTE_DIR"] in env


@pytest.mark.parametrize("script", [ENTRYPOINT, INIT_REPO], ids=lambda p: p.name)
def test_the_container_scripts_are_executable_posix_shell(script):
    assert os.access(script, os.X_OK)
    assert script.read_text().startswith("#!/bin/sh\n")
    subprocess.run(["sh", "-n", str(script)], check=True)


# --- running the scripts and the topology here ---------------------------------------------


def _image_bin(tmp_path: Path) -> Path:
    """The scripts under the names the Dockerfile installs them as (its COPY lines)."""
    bin_dir = tmp_path / "image-bin"
    bin_dir.mkdir(exist_ok=True)
    for word, rest in _dockerfile_instructions():
        source, dest = (rest.split() + [""])[:2]
        if word == "COPY" and source.startswith("docker/") and dest.startswith("/usr/local/bin/"):
            (bin_dir / PurePosixPath(dest).name).symlink_to(ROOT / source)
    return bin_dir


def _script_env(tmp_path: Path, **extra) -> dict[str, str]:
    """The container's environment, its paths moved into tmp_path; on PATH the image's
    scripts and this venv (python, bmad-loop)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("BMAD_LOOP_")}
    env.update(PATH=os.pathsep.join([str(_image_bin(tmp_path)), str(Path(sys.executable).parent),
                                     env.get("PATH", "")]),
               BMAD_LOOP_PROJECT=str(tmp_path / "srv" / "project"),
               BMAD_REMOTE_DIR=str(tmp_path / "srv" / "remote" / "project.git"),
               BMAD_SEED_DIR=str(tmp_path / "seed"))
    env.update(extra)
    return env


def _git(*args, cwd=None) -> str:
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, text=True).stdout.strip()


@pytest.mark.parametrize("seed", ["missing", "default"])
def test_init_repo_without_a_seed_builds_the_demo_once_and_keeps_it_on_a_second_run(tmp_path, seed):
    """`default`: the folder compose mounts when BMAD_SEED is unset; it sits inside this
    repository, which must not be mistaken for a seed."""
    env = _script_env(tmp_path)
    if seed == "default":
        env["BMAD_SEED_DIR"] = str(ROOT / "docker" / "no-seed")
    first = subprocess.run([str(ENTRYPOINT), "init-repo"], env=env, capture_output=True, text=True)
    assert first.returncode == 0, first.stdout + first.stderr
    remote, checkout = Path(env["BMAD_REMOTE_DIR"]), Path(env["BMAD_LOOP_PROJECT"])
    assert _git("--git-dir", str(remote), "rev-parse", "--is-bare-repository") == "true"
    assert (checkout / "_bmad-output/implementation-artifacts/sprint-status.yaml").is_file()
    assert (checkout / ".bmad-loop/policy.toml").is_file()
    assert "demo" in _git("-C", str(checkout), "log", "-1", "--format=%s")
    assert _git("-C", str(checkout), "remote", "get-url", "origin") == str(remote)
    head = _git("-C", str(checkout), "rev-parse", "HEAD")
    (checkout / "local-work.txt").write_text("a human's file\n")
    again = subprocess.run([str(ENTRYPOINT), "init-repo"], env=env, capture_output=True, text=True)
    assert again.returncode == 0, again.stdout + again.stderr
    assert "left as it is" in again.stdout
    assert _git("-C", str(checkout), "rev-parse", "HEAD") == head
    assert (checkout / "local-work.txt").read_text() == "a human's file\n"


def test_init_repo_clones_a_seed_repository_into_the_bare_repository_and_the_checkout(tmp_path):
    init_repo(tmp_path / "seed", {"README.md": "seed\n"}, branch="trunk", message="seed")
    env = _script_env(tmp_path)
    result = subprocess.run([str(ENTRYPOINT), "init-repo"], env=env, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
    checkout = Path(env["BMAD_LOOP_PROJECT"])
    assert (checkout / "README.md").read_text() == "seed\n"
    assert _git("-C", str(checkout), "rev-parse", "--abbrev-ref", "HEAD") == "trunk"


@pytest.mark.scaleout
def test_the_compose_topology_completes_the_demo_sprint_on_loopback_redis_and_postgres(
        compose, tmp_path, postgres_url, redis_namespace):
    """repo-init, then the lane's and the worker's own commands and environment, with only
    the service hosts (and the container paths) moved to this machine."""
    env = _script_env(tmp_path)
    remote = env["BMAD_REMOTE_DIR"]
    consumer_env = _environment(_service(compose, "lane"))
    consumer_env.update(BMAD_LOOP_QUEUE_URL=redis_namespace.url, BMAD_LOOP_DATABASE_URL=postgres_url,
                        BMAD_LOOP_PROJECT=env["BMAD_LOOP_PROJECT"], BMAD_LOOP_SCM_REMOTE=remote)
    env.update(consumer_env)
    init = subprocess.run([str(ENTRYPOINT), *_service(compose, "repo-init")["command"]], env=env,
                          capture_output=True, text=True)
    assert init.returncode == 0, init.stdout + init.stderr
    checkout = Path(env["BMAD_LOOP_PROJECT"])

    from bmad_loop.engine.project import Project
    from bmad_loop.queue.tasks import queue_config

    redis_namespace.adopt(queue_config(Project.open(checkout, policy_module.load_policy(checkout, env=env))).prefix)
    logs = tmp_path / "logs"
    logs.mkdir()
    procs = []
    main_before = _git("-C", str(checkout), "rev-parse", "HEAD")
    for name in ("lane", "worker", "worker"):  # `--scale worker=2`
        n = len(procs)
        log = open(logs / f"{name}-{n}.log", "w")
        # Each container's own filesystem: its clone and (workers) its working folder.
        container = tmp_path / f"container-{n}"
        workdir = container / _service(compose, name).get("working_dir", "/srv/project").lstrip("/")
        workdir.mkdir(parents=True, exist_ok=True)
        argv = [str(container / a.lstrip("/")) if a.startswith("/var/lib/bmad-loop") else a
                for a in _service(compose, name)["command"]]
        proc_env = dict(env)
        if PROJECT_VAR not in _environment(_service(compose, name)):
            del proc_env[PROJECT_VAR]  # a worker container has no checkout
        procs.append(subprocess.Popen([str(ENTRYPOINT), *argv], env=proc_env, cwd=workdir,
                                      stdout=log, stderr=subprocess.STDOUT, start_new_session=True))
    try:
        enqueue = subprocess.run([str(ENTRYPOINT), "bmad-loop", "run", "--enqueue-only"], env=env,
                                 capture_output=True, text=True)
        assert enqueue.returncode == 0, enqueue.stdout + enqueue.stderr
        run_id = enqueue.stdout.strip().splitlines()[-1]

        def state():
            out = subprocess.run(["bmad-loop", "sql", f"SELECT state FROM runs WHERE id = '{run_id}'",
                                  "--json"], env=env, capture_output=True, text=True)
            return out.stdout if out.returncode == 0 else ""

        settled = wait_until(lambda: next((s for s in SETTLED
                                           if f'"{s}"' in state()), None),
                             timeout=180, interval=0.5,
                             what="the demo run settled under the lane and two worker processes")
        health = subprocess.run(_service(compose, "lane")["healthcheck"]["test"][1:], env=env)
        assert health.returncode == 0
        worker_env = {k: v for k, v in env.items() if k != PROJECT_VAR}
        health = subprocess.run(_service(compose, "worker")["healthcheck"]["test"][1:], env=worker_env,
                                cwd=tmp_path / "container-1" / "var" / "lib" / "bmad-loop")
        assert health.returncode == 0
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)  # `docker compose stop`
        codes = [proc.wait(timeout=60) for proc in procs]
    tails = [(p.name, p.read_text()[-2000:]) for p in sorted(logs.iterdir())]
    assert settled == "completed", tails
    assert codes == [0, 0, 0], tails
    stories = subprocess.run(["bmad-loop", "sql", "SELECT story, state FROM v_story_runs", "--json"],
                             env=env, capture_output=True, text=True, check=True).stdout
    assert '"integrated"' in stories and '"escalated"' not in stories
    # The target moved on the shared bare repository; the operator's checkout did not move.
    assert _git("-C", str(checkout), "rev-parse", "HEAD") == main_before
    branch = _git("-C", str(checkout), "rev-parse", "--abbrev-ref", "HEAD")
    assert _git("--git-dir", remote, "rev-parse", branch) != main_before
    assert _git("--git-dir", remote, "merge-base", "--is-ancestor", main_before, branch) == ""
    assert not (checkout / ".bmad-loop" / "state.db").exists()
