"""git, through git's own commands: the runner and its locks, ref names, worktrees, the
guard against planted configuration, remote mode's clone. `trees/` reads and writes commit
content without a worktree; `targets/` is the seam for where the target branch lives.
"""
