"""Tests of inference on a tower: the engine, admission, busy answers, tools, field cases, failover mid-stream."""
