"""Tests of one model over several towers: plans, strategies, RPC access, tunnels, tensor caches."""
