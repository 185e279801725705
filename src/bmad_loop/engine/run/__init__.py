"""A run as a whole: planning and preflight, the consumer set, driving it in the foreground,
the operator's controls, recovery on start, ownership across databases, clean-up.
"""
