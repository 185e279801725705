"""The queues: the two huey instances, their tasks by stable name, the consumers that can be
started from code, and the wake-ups that let idle consumers sleep.
"""
