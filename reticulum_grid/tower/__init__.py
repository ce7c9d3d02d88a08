"""The tower daemon: a composition of inference, training and store, one handler module per command group.

Uses `inference`, `training`, `store`, `node`, `announce` and `links`.
"""

from reticulum_grid.tower.daemon import Tower

__all__ = ["Tower"]
