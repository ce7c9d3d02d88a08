"""``rngrid``: the command line, the only package that prints. One module per verb group."""

from reticulum_grid.cli import infer, serve, store, tower, train, trust  # noqa: F401 (they register their commands)
from reticulum_grid.cli.common import main

__all__ = ["main"]
