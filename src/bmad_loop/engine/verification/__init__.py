"""Verification as a service of the worker and the lane: running `[verify].commands` (with
their retries and the flakes they find), the box and the environment a checked process gets,
a story's verify record, and the target checked on its own.
"""
