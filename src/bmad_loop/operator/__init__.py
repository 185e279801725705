"""Operator surfaces: history, read-only SQL, the live board, attach, journal follow, reports, TUI.

Everything here reads the rows the engine writes and calls the engine's own functions for
actions (stop, resume): there is no second source of truth.
"""
