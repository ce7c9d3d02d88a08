"""Tests of auth and trust: default deny, roles, trusted towers, IFAC, identities, private files, hostile names."""
