"""The run policy: `.bmad-loop/policy.toml`, validated once into an immutable `Policy`.

Config, validation and running are three steps: this package only turns TOML (or a snapshot dict
of the same shape, see `Policy.to_dict`) into frozen dataclasses, and every problem it finds is a
one-line `ConfigError` naming the file (or environment variable), the section and the key.

- `schema`: the frozen dataclasses, one per section, and the rules that span keys;
- `checks`: the value checks (enums, ranges, formats) the schema's fields carry;
- `validate`: the generic validator the fields' types drive, and the one-line messages;
- `load`: reading the file, the snapshot and the environment overrides; the `init` template;
  which project a folder belongs to.

Environment overrides
---------------------
Any variable named `BMAD_LOOP_<SECTION>_<KEY>` overrides the file and wins over it, where
SECTION is one of `SECTIONS` upper-cased and KEY a key of that section upper-cased, e.g.
`BMAD_LOOP_SCM_MAX_PARALLEL=3`, `BMAD_LOOP_DATABASE_URL=postgresql+psycopg://db/loop`.

- Only top-level keys of top-level sections are reachable: `BMAD_LOOP_ADAPTER_TIMEOUT_S` works,
  `[adapter.dev] timeout_s` or `[footprints."1-2-auth"]` cannot be addressed key by key. A
  table-valued key may be replaced whole with an inline table, e.g.
  `BMAD_LOOP_ADAPTER_ENV='{ API_KEY = "x" }'`. In `[resources]` every KEY is a capacity
  (`BMAD_LOOP_RESOURCES_GPU=2` means `gpu = 2`) except `PORTS`; names that are not valid in an
  environment variable (`"service:db"`) need the file.
- The value is read as a TOML value (`3`, `true`, `["pytest -q", "ruff check"]`); a key that
  expects a string takes the raw text as is, and so does any value that is not valid TOML.
- A variable whose SECTION part is not a section is not ours and is ignored: the agent's own
  environment (`BMAD_LOOP_RUN_ID`, `BMAD_LOOP_STORY_KEY`, `BMAD_LOOP_PHASE`, ...) never errors.
  The SECTION must be followed by `_`, so `BMAD_LOOP_STORY_KEY` is not section `stories`.
- A known section with an unknown key is an error naming the variable, and so is a bad value.
"""

from __future__ import annotations

from .checks import COMMIT_PLACEHOLDERS
from .load import (
    ENV_PREFIX,
    default_policy_text,
    env_override,
    find_project_root,
    load_policy,
    policy_from_dict,
    policy_path,
)
from .schema import (
    SECTIONS,
    AdapterPolicy,
    CleanupPolicy,
    DatabasePolicy,
    FootprintOverride,
    FootprintsPolicy,
    GatesPolicy,
    LeasesPolicy,
    LimitsPolicy,
    NotifyPolicy,
    ParallelPolicy,
    PhaseOverride,
    Policy,
    QueuePolicy,
    ResourcesPolicy,
    ReviewPolicy,
    ScmPolicy,
    StoriesPolicy,
    TierPolicy,
    VerifyPolicy,
    identity_keys,
)

__all__ = [
    "env_override",
    "COMMIT_PLACEHOLDERS",
    "SECTIONS",
    "ENV_PREFIX",
    "AdapterPolicy",
    "CleanupPolicy",
    "DatabasePolicy",
    "FootprintOverride",
    "FootprintsPolicy",
    "GatesPolicy",
    "LeasesPolicy",
    "LimitsPolicy",
    "NotifyPolicy",
    "ParallelPolicy",
    "PhaseOverride",
    "Policy",
    "QueuePolicy",
    "ResourcesPolicy",
    "ReviewPolicy",
    "ScmPolicy",
    "StoriesPolicy",
    "TierPolicy",
    "VerifyPolicy",
    "default_policy_text",
    "find_project_root",
    "identity_keys",
    "load_policy",
    "policy_from_dict",
    "policy_path",
]
