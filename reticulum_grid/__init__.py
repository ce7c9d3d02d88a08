"""reticulum_grid: a GPU grid over the Reticulum Network Stack.

``from reticulum_grid import Grid`` is the client API (docs/python.md). Packages,
one per capability, from the bottom: node, store, inference, training, split,
voice, tower, client, gateway, cli. What each may import: docs/architecture.md.
"""

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # what __getattr__ hands on, as a type checker sees it
    from reticulum_grid.client import Grid, Usage


def __getattr__(name: str) -> type:
    # Lazy, so a trainer worker or a test of one package does not start RNS imports.
    if name in ("Grid", "Usage"):
        from reticulum_grid import client
        return getattr(client, name)
    raise AttributeError(f"module 'reticulum_grid' has no attribute {name!r}")


__all__ = ["Grid", "Usage"]
