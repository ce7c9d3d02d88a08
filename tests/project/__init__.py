"""Tests of the project itself: docs, layers, the suite's rules, requirements,
install, model import, the llama.cpp build, the GPU check."""
