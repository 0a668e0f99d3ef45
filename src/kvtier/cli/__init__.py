"""The ``kvtier`` command line: a registry of subcommands sharing one error convention.

Every command has ``--help``, prints a table for people and one JSON object with ``--json``,
and on bad input exits with status 2 after a one-line ``kvtier CMD: error: ...`` message.
"""

from kvtier.cli.main import main

__all__ = ["main"]
