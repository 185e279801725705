"""Operator surfaces: status for people, the live board, journal follow, attach, history,
read-only SQL, the reports, the TUI.

Everything here reads the rows the engine writes and calls the engine's own functions for
actions (stop, resume): there is no second source of truth.
"""
