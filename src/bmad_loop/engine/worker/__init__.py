"""A story's worker: the walk through its phases, its agent sessions, its verify, the
contexts and claims its steps receive, and the body of a `stories` task.
"""
