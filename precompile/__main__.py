"""``python -m precompile``: the command line (as the ``precompile`` console script)."""

from precompile.cli import main

main(prog_name="precompile")
