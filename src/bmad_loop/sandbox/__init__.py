"""The box agents and verify commands run in: what they may write, and how the OS enforces it.

- `probe`: is bubblewrap (Linux) or sandbox-exec (macOS) usable here, asked by running it once;
- `mode`: what `[adapter] sandbox` / `[verify] sandbox` ("auto", "on", "off") mean on this host;
- `plan`: the writable set of one session, as an ordered list of mounts;
- `bwrap`: that plan as a bubblewrap command line (Linux);
- `seatbelt`: that plan as a sandbox-exec profile (macOS; generated and unit-tested, not run);
- `box`: a ready box (plan, wrapper, environment) and its git object quarantine.
"""

from .box import SANDBOX_VAR, Box, make_box, quarantine_has_objects
from .mode import MODES, BoxDecision, decide, startup_notes
from .plan import BoxRequest, Mount, plan_mounts

__all__ = ["SANDBOX_VAR", "Box", "BoxDecision", "BoxRequest", "MODES", "Mount", "decide", "make_box",
           "plan_mounts", "quarantine_has_objects", "startup_notes"]
