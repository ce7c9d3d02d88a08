"""Tests of the blob store and its sync: content addressing, pulls and pushes, resume, hostile names and sources."""
