"""Kept for importers not yet moved: see `transitions` and `runs`."""

from .runs import board_rel, path_inside, run_policy, stories_of  # noqa: F401
from .transitions import transition_run, transition_story  # noqa: F401
