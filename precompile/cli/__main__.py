"""``python -m precompile.cli``: the command line."""

from precompile.cli import main

main(prog_name="precompile")
