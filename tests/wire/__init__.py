"""Tests of the wire: framing, the protocol registry, token streams, the rns 0.9.4 fixes,
RNS configs, fuzzed decoders."""
