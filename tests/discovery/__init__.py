"""Tests of discovery and routing: announces, caps, the tower table, ranking, failover between towers."""
