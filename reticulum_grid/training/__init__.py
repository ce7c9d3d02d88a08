"""LoRA training jobs: request schema, datasets, the torch+peft worker, sqlite jobs, GGUF adapters, LXMF notices.

Uses `store`, `node` and `links`.
"""
