"""The Grid client: discovery, routing, failover, inference streams, pull/push, jobs.

Uses `store`, `node`, `announce` and `links`.
"""

from reticulum_grid.client.grid import Grid
from reticulum_grid.client.stream import InferenceStream, Usage

__all__ = ["Grid", "InferenceStream", "Usage"]
