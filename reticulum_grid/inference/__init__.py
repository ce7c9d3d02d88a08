"""Running models on a tower: request schema, the llama.cpp backend, the model registry, admission.

Uses `store`, `node` and `links`.
"""
