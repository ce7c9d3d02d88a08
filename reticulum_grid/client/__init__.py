"""The Grid client: discovery, routing, failover, inference streams, pull/push, jobs.

Uses `split` (plans, estimates), `training` (its request), `voice` (codecs, its requests), `store`, `node`,
`announce` and `links`.
"""

from reticulum_grid.client.grid import Grid
from reticulum_grid.client.embeddings import Embeddings
from reticulum_grid.client.pieces import Text, ToolCallDelta, Usage
from reticulum_grid.client.stream import InferenceStream

__all__ = ["Embeddings", "Grid", "InferenceStream", "Text", "ToolCallDelta", "Usage"]
