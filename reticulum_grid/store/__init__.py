"""Content-addressed blobs (models, adapters, datasets) and their chunked, verified sync.

Uses `node`, `announce` and `links`.
"""
