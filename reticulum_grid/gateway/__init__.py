"""`rngrid serve`: the grid behind OpenAI's and Ollama's HTTP APIs, a command API and a dashboard page.

Uses `client` (one Grid: routing, failover, busy-retry), `training` (the train request), `voice` (audio formats),
`store`, `node`, `links`; Starlette, uvicorn, sse-starlette.
"""
