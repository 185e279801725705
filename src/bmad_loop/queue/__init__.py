"""The queues: the two huey instances, their tasks by stable name, and the consumers that can
be started from code.
"""
