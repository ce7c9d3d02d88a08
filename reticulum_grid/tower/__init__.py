"""The tower daemon: a composition of the capabilities below, one handler module per command group.

Uses `split`, `inference`, `training`, `voice`, `store`, `node`, `announce` and `links`.
"""

from reticulum_grid.tower.daemon import Tower

__all__ = ["Tower"]
