"""Tests of `rngrid serve`: the OpenAI and Ollama APIs, websockets, floods, the JavaScript client and the dashboard."""
