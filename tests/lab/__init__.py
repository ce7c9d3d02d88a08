"""Tests of the network lab (testbed/lab/) and of the grid over its shaped links between namespaces."""
