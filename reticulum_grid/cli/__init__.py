"""``rngrid``: the command line, the only package that prints. One module per verb group.

Uses `gateway`, `tower`, `client`, `demo`, `split`, `inference`, `training`, `voice`, `store` and `node`.
"""

# Each module registers its commands.
from reticulum_grid.cli import execute, infer, serve, store, tower, train, trust, voice  # noqa: F401
from reticulum_grid.cli.common import main

__all__ = ["main"]
