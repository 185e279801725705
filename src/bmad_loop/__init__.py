"""bmad-loop: bounded parallel fan-out of coding agents over a BMAD sprint."""

__version__ = "0.1.0"
