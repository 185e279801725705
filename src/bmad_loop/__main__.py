"""`python -m bmad_loop` is the `bmad-loop` command."""

from .cli import main

main()
