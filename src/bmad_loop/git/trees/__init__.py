"""Commit content without a worktree: the committed tree read, diffs, three-way merges, tree
edits, merge attributes and rules, and the lane's candidate composed from them.
"""
