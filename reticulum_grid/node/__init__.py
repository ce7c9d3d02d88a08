"""One RNS node: config files, persistent identity, RNS start-up, hardware probe, Links to towers.

Uses `announce` and `links` only.
"""
