"""`python -m bmad_loop …` runs the CLI (the TUI launches `resume` this way)."""

from .cli import main

main()
