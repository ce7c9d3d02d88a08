"""Tests of voice: speech to text and text to speech through towers and the gateway."""
