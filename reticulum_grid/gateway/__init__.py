"""`rngrid serve`: the grid behind an OpenAI-compatible HTTP API, a command API and a dashboard page.

Uses `client` (one Grid: routing, failover, busy-retry), `store`, `node`, `links`; Starlette, uvicorn, sse-starlette.
"""
