"""Where a story's work happens: the `Workspace` seam, worktrees per story (with a pool of
parked ones), the project's own checkout, and the guard that keeps agents off the target.
"""
