"""The policy contract: `.bmad-loop/policy.toml`, its defaults, its errors and its env overrides."""

import dataclasses
import json
import re
import tomllib

import pytest

from bmad_loop.errors import ConfigError
from bmad_loop.agents.profiles import known_profiles
from bmad_loop.policy import (
    SECTIONS,
    FootprintOverride,
    PhaseOverride,
    Policy,
    TierPolicy,
    default_policy_text,
    load_policy,
    policy_from_dict,
    policy_path,
)


@pytest.fixture
def project(tmp_path):
    """A project folder with an empty .bmad-loop/; write_policy() puts a policy.toml in it."""
    (tmp_path / ".bmad-loop").mkdir()
    return tmp_path


def write_policy(project, text):
    policy_path(project).write_text(text, encoding="utf-8")
    return str(policy_path(project))


def load_error(project, text, env=None) -> str:
    """Load `text` as the project's policy and return the one-line ConfigError message."""
    write_policy(project, text)
    with pytest.raises(ConfigError) as info:
        load_policy(project, env=env or {})
    message = str(info.value)
    assert "\n" not in message
    return message


# --- defaults and the template -------------------------------------------------------------


def test_no_policy_file_means_the_defaults(tmp_path):
    policy = load_policy(tmp_path, env={})
    assert policy == Policy()
    assert policy.source == "<defaults>"
    assert policy.scm.max_parallel == 1
    assert policy.scm.isolation == "worktree"
    assert policy.scm.merge_strategy == "merge"
    assert policy.limits.max_dev_attempts == 2
    assert policy.verify.timeout_s == 1800
    assert policy.gates.mode == "per-epic"
    assert policy.adapter.timeout_s == 5400
    assert policy.leases.ttl_s == 60
    assert policy.footprints.drift == "warn"
    assert policy.queue.backend == "sqlite"
    assert policy.notify.timeout_s == 10
    assert policy.cleanup.keep_runs == 10


def test_the_template_loads_to_exactly_the_defaults(project):
    source = write_policy(project, default_policy_text())
    policy = load_policy(project, env={})
    assert policy == load_policy(project.parent / "no-such-project", env={})
    assert policy == Policy()
    assert policy.source == source


def test_the_template_names_every_section_and_key():
    text = default_policy_text()
    for section in SECTIONS:
        assert re.search(rf"^\[{section}\]$", text, re.M), section
        section_cls = type(getattr(Policy(), section))
        for f in dataclasses.fields(section_cls):
            if f.metadata.get("rest"):
                continue
            assert re.search(rf"^(# )?\[{section}\.{f.name}[].]|^(# )?{f.name} = ", text, re.M), (section, f.name)


def test_to_dict_is_json_and_round_trips_through_policy_from_dict():
    policy = policy_from_dict(
        {
            "scm": {"max_parallel": 4, "worktree_seed": [".env"], "merge_strategy": "squash"},
            "verify": {"commands": ["pytest -q", "ruff check ."]},
            "adapter": {
                "command": ["agent", "{prompt_file}"],
                "env": {"A": "1"},
                "dev": {"timeout_s": 60, "env": {"B": "2"}},
                "tiers": {"fast": {"model": "m", "args": ["--x"]}},
            },
            "footprints": {"drift": "escalate", "1-2-auth": {"files": ["src/auth/**"]}},
            "resources": {"gpu": 2, "service:db": 1, "ports": "9000-9099"},
            "parallel": {"tier": "fast"},
        }
    )
    data = policy.to_dict()
    assert json.loads(json.dumps(data)) == data
    assert set(data) == set(SECTIONS)
    assert policy_from_dict(data) == policy
    assert policy_from_dict(Policy().to_dict()) == Policy()


def test_policy_objects_are_immutable():
    policy = Policy()
    with pytest.raises(dataclasses.FrozenInstanceError):
        policy.scm.max_parallel = 2
    with pytest.raises(TypeError):
        policy.adapter.env["X"] = "y"


# --- malformed files, unknown names --------------------------------------------------------


def test_malformed_toml_names_the_file_and_the_line(project):
    message = load_error(project, "[scm]\nmax_parallel = = 3\n")
    assert message.startswith(f"{policy_path(project)}: invalid TOML: ")
    assert "line 2" in message


def test_unknown_key_names_the_nearest_valid_key(project):
    message = load_error(project, "[scm]\nmax_paralel = 3\n")
    assert message == f"{policy_path(project)}: [scm] max_paralel: unknown key (did you mean 'max_parallel'?)"


def test_unknown_key_with_nothing_close_has_no_hint(project):
    message = load_error(project, "[scm]\nzzz = 3\n")
    assert message == f"{policy_path(project)}: [scm] zzz: unknown key"


def test_unknown_section_names_the_nearest_section(project):
    message = load_error(project, "[scmm]\nmax_parallel = 3\n")
    assert message == f"{policy_path(project)}: [scmm]: unknown section (did you mean 'scm'?)"


def test_a_key_outside_its_section_points_to_the_section(project):
    message = load_error(project, "max_parallel = 3\n")
    assert message == f"{policy_path(project)}: [max_parallel]: unknown section (did you mean [scm] max_parallel?)"


def test_unknown_key_in_a_sub_table_names_the_sub_table(project):
    message = load_error(project, "[adapter.tiers.fast]\ntimeout = 3\n")
    assert message == f"{policy_path(project)}: [adapter.tiers.fast] timeout: unknown key (did you mean 'timeout_s'?)"
    message = load_error(project, "[adapter.dev]\ncomand = ['x']\n")
    assert message == f"{policy_path(project)}: [adapter.dev] comand: unknown key (did you mean 'command'?)"


# --- wrong types ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ('[scm]\nmax_parallel = "x"\n', "[scm] max_parallel: expected an integer, got string 'x'"),
        ("[scm]\nmax_parallel = true\n", "[scm] max_parallel: expected an integer, got boolean true"),
        ("[scm]\nkeep_failed = 1\n", "[scm] keep_failed: expected a boolean, got integer 1"),
        ("[scm]\ntarget_branch = 1\n", "[scm] target_branch: expected a string, got integer 1"),
        ('[verify]\ncommands = "pytest"\n', "[verify] commands: expected an array of strings, got string 'pytest'"),
        ('[verify]\ncommands = ["a", 2]\n', "[verify] commands: expected an array of strings, item 2 is integer 2"),
        ("[adapter.env]\nTOKEN = 1\n", "[adapter.env] TOKEN: expected a string, got integer 1"),
        ('[adapter]\ndev = "x"\n', "[adapter] dev: expected a table, got string 'x'"),
        ('[adapter.tiers.fast]\ntimeout_s = "1"\n', "[adapter.tiers.fast] timeout_s: expected an integer, got string '1'"),
        ("scm = 3\n", "[scm]: expected a table, got integer 3"),
    ],
)
def test_wrong_type_names_the_key_and_what_it_got(project, text, expected):
    assert load_error(project, text) == f"{policy_path(project)}: {expected}"


# --- enums, ranges, formats ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ('[scm]\nmerge_strategy = "rebase"\n',
         "[scm] merge_strategy: must be one of 'ff', 'merge', 'squash', got 'rebase'"),
        ('[scm]\nisolation = "container"\n', "[scm] isolation: must be one of 'none', 'worktree', got 'container'"),
        ('[gates]\nmode = "always"\n', "[gates] mode: must be one of 'none', 'per-epic', 'per-story-spec-approval', got 'always'"),
        ('[footprints]\ndefault = "shared"\n', "[footprints] default: must be one of 'exclusive', got 'shared'"),
        ('[footprints]\ndrift = "ignore"\n', "[footprints] drift: must be one of 'warn', 'escalate', got 'ignore'"),
        ('[queue]\nbackend = "kafka"\n', "[queue] backend: must be one of 'sqlite', 'redis', got 'kafka'"),
        ('[parallel]\non_escalation = "stop"\n', "[parallel] on_escalation: must be one of 'pause', 'continue', got 'stop'"),
        ('[parallel]\nmerge_class = "auto"\n', "[parallel] merge_class: must be one of 'self', 'operator', got 'auto'"),
        ('[adapter]\nprofile = "copilot"\n', "[adapter] profile: must be one of 'claude', 'codex', 'gemini', 'opencode', 'qwen', got 'copilot'"),
    ],
)
def test_enum_violation_lists_the_allowed_values(project, text, expected):
    assert load_error(project, text) == f"{policy_path(project)}: {expected}"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("[scm]\nmax_parallel = 0\n", "[scm] max_parallel: must be >= 1, got 0"),
        ("[limits]\nmax_dev_attempts = 0\n", "[limits] max_dev_attempts: must be >= 1, got 0"),
        ("[limits]\nmax_review_cycles = -1\n", "[limits] max_review_cycles: must be >= 0, got -1"),
        ("[limits]\nmax_recompose = -1\n", "[limits] max_recompose: must be >= 0, got -1"),
        ("[verify]\ntimeout_s = 0\n", "[verify] timeout_s: must be >= 1, got 0"),
        ("[adapter]\ntimeout_s = 0\n", "[adapter] timeout_s: must be >= 1, got 0"),
        ("[adapter.review]\ntimeout_s = 0\n", "[adapter.review] timeout_s: must be >= 1, got 0"),
        ("[adapter.tiers.fast]\ntimeout_s = -5\n", "[adapter.tiers.fast] timeout_s: must be >= 1, got -5"),
        ("[leases]\nttl_s = 2\n", "[leases] ttl_s: must be >= 3, got 2"),
        ("[notify]\ntimeout_s = 0\n", "[notify] timeout_s: must be >= 1, got 0"),
        ("[cleanup]\nkeep_runs = -1\n", "[cleanup] keep_runs: must be >= 0, got -1"),
        ('[resources]\n"service:db" = 0\n', '[resources] "service:db": must be >= 1, got 0'),
    ],
)
def test_range_violation_names_the_bound_and_the_value(project, text, expected):
    assert load_error(project, text) == f"{policy_path(project)}: {expected}"


@pytest.mark.parametrize("isolation, branch_per", [("none", "story"), ("worktree", "run")])
def test_max_parallel_above_one_needs_worktree_isolation_and_a_branch_per_story(project, isolation, branch_per):
    text = f'[scm]\nmax_parallel = 3\nisolation = "{isolation}"\nbranch_per = "{branch_per}"\n'
    assert load_error(project, text) == (
        f'{policy_path(project)}: [scm] max_parallel = 3 needs [scm] isolation = "worktree"'
        ' and [scm] branch_per = "story"'
    )


def test_max_parallel_one_is_fine_in_place():
    policy = policy_from_dict({"scm": {"isolation": "none", "branch_per": "run", "max_parallel": 1}})
    assert policy.scm.isolation == "none"


@pytest.mark.parametrize("template", ["{story_key} {author}", "{0}", "{story_key", "{story_key.upper}"])
def test_commit_message_template_rejects_other_placeholders(project, template):
    message = load_error(project, f"[scm]\ncommit_message_template = {json.dumps(template)}\n")
    assert message.startswith(f"{policy_path(project)}: [scm] commit_message_template: ")


def test_commit_message_template_takes_the_four_placeholders():
    template = "{epic}/{story_key}: {story_title} ({run_id})"
    assert policy_from_dict({"scm": {"commit_message_template": template}}).scm.commit_message_template == template


def test_profile_and_command_together_is_an_error_naming_the_command(project):
    message = load_error(project, '[adapter]\nprofile = "claude"\ncommand = ["claude"]\n')
    assert message.startswith(f"{policy_path(project)}: [adapter] command: ")


def test_the_accepted_profiles_are_the_profile_files():
    from pathlib import Path

    import bmad_loop.agents.profiles as profiles

    files = {p.stem for p in Path(profiles.__file__).parent.glob("*.toml")}
    assert set(known_profiles()) == files and "claude" in files
    for profile in files:
        assert policy_from_dict({"adapter": {"profile": profile}}).adapter.profile == profile
    with pytest.raises(ConfigError, match="must be one of 'claude'"):
        policy_from_dict({"adapter": {"profile": "not-a-profile-file"}})


def test_an_empty_phase_command_is_an_error(project):
    message = load_error(project, "[adapter.fix]\ncommand = []\n")
    assert message.startswith(f"{policy_path(project)}: [adapter.fix] command: must not be empty")


@pytest.mark.parametrize("url", ["", "http://localhost:6379", "localhost"])
def test_a_redis_backend_needs_a_redis_url(project, url):
    message = load_error(project, f'[queue]\nbackend = "redis"\nurl = "{url}"\n')
    assert message.startswith(f"{policy_path(project)}: [queue] url: ")


def test_a_redis_backend_takes_redis_and_rediss_urls():
    for url in ("redis://localhost:6379/0", "rediss://cache.example:6380"):
        assert policy_from_dict({"queue": {"backend": "redis", "url": url}}).queue.url == url


def test_the_lane_tier_must_name_an_adapter_tier(project):
    text = '[parallel]\ntier = "fats"\n[adapter.tiers.fast]\nmodel = "m"\n'
    assert load_error(project, text).startswith(f"{policy_path(project)}: [parallel] tier: ")
    assert "did you mean 'fast'?" in load_error(project, text)
    policy = policy_from_dict({"parallel": {"tier": "fast"}, "adapter": {"tiers": {"fast": {}}}})
    assert policy.parallel.tier == "fast"


@pytest.mark.parametrize(
    ("text", "key"),
    [
        ('[notify]\nwebhook = "ftp://x"\n', "[notify] webhook"),
        ('[database]\nurl = "not a url"\n', "[database] url"),
    ],
)
def test_urls_are_checked(project, text, key):
    assert load_error(project, text).startswith(f"{policy_path(project)}: {key}: must be a URL")


# --- adapter, footprints, resources --------------------------------------------------------


def test_tiers_and_phase_overrides_are_parsed():
    policy = policy_from_dict(
        {
            "adapter": {
                "profile": "codex",
                "timeout_s": 100,
                "env": {"A": "1"},
                "dev": {"command": ["agent", "--dev"], "timeout_s": 50, "env": {"B": "2"}},
                "review": {"timeout_s": 20},
                "tiers": {"fast": {"model": "small", "args": ["--quick"], "timeout_s": 10}, "deep": {"model": "big"}},
            }
        }
    )
    adapter = policy.adapter
    assert adapter.dev == PhaseOverride(command=("agent", "--dev"), timeout_s=50, env={"B": "2"})
    assert adapter.phase("review") == PhaseOverride(timeout_s=20)
    assert adapter.phase("fix") == PhaseOverride()
    assert adapter.tiers["fast"] == TierPolicy(model="small", args=("--quick",), timeout_s=10)
    assert adapter.tiers["deep"] == TierPolicy(model="big")
    assert dict(adapter.env) == {"A": "1"}
    assert adapter.timeout_for("dev", "fast") == 10
    assert adapter.timeout_for("dev", "deep") == 50
    assert adapter.timeout_for("fix") == 100
    with pytest.raises(ValueError):
        adapter.phase("deploy")


def test_footprint_overrides_are_parsed_from_sub_tables(project):
    write_policy(
        project,
        '[footprints]\ndrift = "escalate"\n'
        '[footprints."1-2-user-auth"]\nfiles = ["src/auth/**"]\nshared = ["src/app/__init__.py"]\nresources = ["database"]\n'
        '[footprints."2-1a-split"]\nfiles = ["docs/**"]\n',
    )
    footprints = load_policy(project, env={}).footprints
    assert footprints.drift == "escalate"
    assert footprints.overrides["1-2-user-auth"] == FootprintOverride(
        files=("src/auth/**",), shared=("src/app/__init__.py",), resources=("database",)
    )
    assert footprints.overrides["2-1a-split"] == FootprintOverride(files=("docs/**",))


def test_a_bad_footprint_override_names_the_story_key(project):
    message = load_error(project, '[footprints."1-2-user-auth"]\nfile = ["x"]\n')
    assert message == f'{policy_path(project)}: [footprints."1-2-user-auth"] file: unknown key (did you mean \'files\'?)'
    message = load_error(project, '[footprints]\ndrfit = "warn"\n')
    assert message == f"{policy_path(project)}: [footprints] drfit: unknown key (did you mean 'drift'?)"


def test_resources_are_capacities_and_a_port_block():
    resources = policy_from_dict({"resources": {"service:db": 1, "gpu": 2, "ports": "9000-9099"}}).resources
    assert dict(resources.capacities) == {"service:db": 1, "gpu": 2}
    assert resources.capacity("gpu") == 2
    assert resources.capacity("database") == 1
    assert resources.ports == "9000-9099"
    assert resources.port_range == (9000, 9099)
    assert Policy().resources.port_range is None


@pytest.mark.parametrize("ports", ["9000", "0-10", "10-5", "1-65536", "a-b", "9000-9099-1"])
def test_a_bad_port_block_names_the_ports_key(project, ports):
    message = load_error(project, f'[resources]\nports = "{ports}"\n')
    assert message == (
        f'{policy_path(project)}: [resources] ports: must be "LOW-HIGH" with 1 <= LOW <= HIGH <= 65535, got {ports!r}'
    )


def test_a_capacity_must_be_an_integer(project):
    message = load_error(project, '[resources]\ngpu = "two"\n')
    assert message == f"{policy_path(project)}: [resources] gpu: expected an integer, got string 'two'"


# --- environment overrides -----------------------------------------------------------------


def test_env_override_wins_over_the_file_and_parses_ints_bools_and_lists(project):
    write_policy(project, '[scm]\nmax_parallel = 2\nkeep_failed = true\n[verify]\ncommands = ["make"]\n')
    env = {
        "BMAD_LOOP_SCM_MAX_PARALLEL": "3",
        "BMAD_LOOP_SCM_KEEP_FAILED": "false",
        "BMAD_LOOP_VERIFY_COMMANDS": '["pytest -q", "ruff check ."]',
        "BMAD_LOOP_DATABASE_URL": "postgresql+psycopg://db/loop",
        "BMAD_LOOP_SCM_TARGET_BRANCH": "true",  # a string key takes the raw text
        "BMAD_LOOP_RESOURCES_GPU": "2",
        "BMAD_LOOP_RESOURCES_PORTS": "9000-9099",
    }
    policy = load_policy(project, env=env)
    assert policy.scm.max_parallel == 3
    assert policy.scm.keep_failed is False
    assert policy.verify.commands == ("pytest -q", "ruff check .")
    assert policy.database.url == "postgresql+psycopg://db/loop"
    assert policy.scm.target_branch == "true"
    assert policy.resources.capacity("gpu") == 2
    assert policy.resources.port_range == (9000, 9099)


def test_env_override_applies_without_a_file(tmp_path):
    policy = load_policy(tmp_path, env={"BMAD_LOOP_GATES_MODE": "none", "BMAD_LOOP_ADAPTER_ENV": '{ K = "v" }'})
    assert policy.gates.mode == "none"
    assert dict(policy.adapter.env) == {"K": "v"}


def test_load_policy_reads_os_environ_by_default(tmp_path, monkeypatch):
    monkeypatch.setenv("BMAD_LOOP_LIMITS_MAX_DEV_ATTEMPTS", "5")
    assert load_policy(tmp_path).limits.max_dev_attempts == 5


def test_policy_from_dict_applies_env_only_when_given():
    env = {"BMAD_LOOP_CLEANUP_KEEP_RUNS": "0"}
    assert policy_from_dict({}).cleanup.keep_runs == 10
    assert policy_from_dict({}, env=env).cleanup.keep_runs == 0


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({"BMAD_LOOP_SCM_MAX_PARALLEL": "x"}, "BMAD_LOOP_SCM_MAX_PARALLEL: [scm] max_parallel: expected an integer, got string 'x'"),
        ({"BMAD_LOOP_SCM_MAX_PARALLEL": "0"}, "BMAD_LOOP_SCM_MAX_PARALLEL: [scm] max_parallel: must be >= 1, got 0"),
        ({"BMAD_LOOP_REVIEW_ENABLED": "yes"}, "BMAD_LOOP_REVIEW_ENABLED: [review] enabled: expected a boolean, got string 'yes'"),
        ({"BMAD_LOOP_SCM_MERGE_STRATEGY": "rebase"},
         "BMAD_LOOP_SCM_MERGE_STRATEGY: [scm] merge_strategy: must be one of 'ff', 'merge', 'squash', got 'rebase'"),
        ({"BMAD_LOOP_SCM_MAX_PARALEL": "3"},
         "BMAD_LOOP_SCM_MAX_PARALEL: [scm] max_paralel: unknown key (did you mean 'max_parallel'?)"),
        ({"BMAD_LOOP_SCM_ISOLATION": "none", "BMAD_LOOP_SCM_MAX_PARALLEL": "2"},
         'BMAD_LOOP_SCM_MAX_PARALLEL: [scm] max_parallel = 2 needs [scm] isolation = "worktree" and [scm] branch_per = "story"'),
        ({"BMAD_LOOP_QUEUE_BACKEND": "redis"},
         "BMAD_LOOP_QUEUE_BACKEND: [queue] url: backend \"redis\" needs a redis:// or rediss:// url, got ''"),
    ],
)
def test_env_var_with_a_bad_value_names_the_variable(project, env, expected):
    write_policy(project, "[scm]\nmax_parallel = 1\n")
    with pytest.raises(ConfigError) as info:
        load_policy(project, env=env)
    assert str(info.value) == expected


def test_a_file_error_is_still_blamed_on_the_file_when_env_is_set(project):
    message = load_error(project, "[scm]\nmax_parallel = 0\n", env={"BMAD_LOOP_SCM_KEEP_FAILED": "true"})
    assert message == f"{policy_path(project)}: [scm] max_parallel: must be >= 1, got 0"


def test_unrelated_bmad_loop_variables_are_ignored(tmp_path):
    env = {
        "BMAD_LOOP_RUN_ID": "20261202-101500-a1b2",
        "BMAD_LOOP_STORY_KEY": "1-2-user-auth",
        "BMAD_LOOP_STORY_FILE": "/w/1-2-user-auth.md",
        "BMAD_LOOP_PHASE": "dev",
        "BMAD_LOOP_WORKTREE": "/w",
        "BMAD_LOOP_STATE_DIR": "/s",
        "BMAD_LOOP_TMPDIR": "/t",
        "BMAD_LOOP_PROMPT_FILE": "/p",
        "BMAD_LOOP_ATTEMPT": "1",
        "BMAD_LOOP_BASE_SHA": "abc",
        "BMAD_LOOP_SCM": "no key part",
        "BMAD_LOOPSCM_MAX_PARALLEL": "x",
        "OTHER_SCM_MAX_PARALLEL": "x",
    }
    assert load_policy(tmp_path, env=env) == Policy()


def test_an_env_var_for_a_nested_footprint_key_is_an_unknown_key(tmp_path):
    with pytest.raises(ConfigError) as info:
        load_policy(tmp_path, env={"BMAD_LOOP_FOOTPRINTS_DRFIT": "warn"})
    assert str(info.value) == "BMAD_LOOP_FOOTPRINTS_DRFIT: [footprints] drfit: unknown key (did you mean 'drift'?)"


# --- with_max_parallel ---------------------------------------------------------------------


def test_with_max_parallel_returns_a_new_policy():
    policy = Policy()
    wider = policy.with_max_parallel(4)
    assert wider.scm.max_parallel == 4
    assert policy.scm.max_parallel == 1
    assert wider.adapter == policy.adapter


@pytest.mark.parametrize(
    ("n", "expected"),
    [
        (0, "--parallel: [scm] max_parallel: must be >= 1, got 0"),
        (-1, "--parallel: [scm] max_parallel: must be >= 1, got -1"),
        ("x", "--parallel: [scm] max_parallel: expected an integer, got string 'x'"),
        (True, "--parallel: [scm] max_parallel: expected an integer, got boolean true"),
    ],
)
def test_with_max_parallel_rejects_what_the_key_rejects(n, expected):
    with pytest.raises(ConfigError) as info:
        Policy().with_max_parallel(n)
    assert str(info.value) == expected


def test_with_max_parallel_keeps_the_guard_and_names_the_flag():
    in_place = policy_from_dict({"scm": {"isolation": "none"}})
    with pytest.raises(ConfigError) as info:
        in_place.with_max_parallel(3, source="-p")
    assert str(info.value) == (
        '-p: [scm] max_parallel = 3 needs [scm] isolation = "worktree" and [scm] branch_per = "story"'
    )
    assert in_place.with_max_parallel(1).scm.max_parallel == 1


# --- odd files -----------------------------------------------------------------------------


def test_a_policy_file_that_is_not_utf8_names_the_file(project):
    policy_path(project).write_bytes(b"[scm]\ntarget_branch = '\xff'\n")
    with pytest.raises(ConfigError) as info:
        load_policy(project, env={})
    assert str(info.value).startswith(f"{policy_path(project)}: not UTF-8 text")


def test_policy_from_dict_names_its_source(project):
    with pytest.raises(ConfigError) as info:
        policy_from_dict({"scm": {"max_parallel": 0}}, source="run 20261202-101500-a1b2")
    assert str(info.value) == "run 20261202-101500-a1b2: [scm] max_parallel: must be >= 1, got 0"


def test_template_is_valid_toml_with_every_section():
    assert set(tomllib.loads(default_policy_text())) == set(SECTIONS)


def test_identity_is_a_flag_on_the_settings_a_run_is_made_of():
    from bmad_loop.policy import identity_keys

    assert identity_keys() == {
        "scm": ("isolation", "branch_per", "target_branch", "remote"),
        "queue": ("backend", "url"),
        "database": ("url", "lock_wait_s"),
    }


def test_every_word_valued_key_takes_its_values_from_one_enum():
    import dataclasses

    from bmad_loop.policy import SECTIONS, Policy
    from bmad_loop.policy.choices import GateMode, QueueBackendKind
    from bmad_loop.queue.backends import BACKENDS

    policy = Policy()
    enums = {}
    for section in SECTIONS:
        for f in dataclasses.fields(getattr(policy, section)):
            if f.metadata.get("choices"):
                enums[f"{section}.{f.name}"] = f.metadata["choices"]
                assert getattr(getattr(policy, section), f.name) in set(f.metadata["choices"])
    assert enums["gates.mode"] is GateMode and len(enums) >= 15
    # a refused value names the enum's values, in its order
    with pytest.raises(ConfigError, match="'none', 'per-epic', 'per-story-spec-approval', got 'daily'"):
        policy_from_dict({"gates": {"mode": "daily"}})
    # the queue kinds the policy accepts are the back-end classes there are
    assert set(BACKENDS) == {kind.value for kind in QueueBackendKind}
