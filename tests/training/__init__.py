"""Tests of LoRA training: jobs, requests, data-parallel and local-step training, the data plane."""
