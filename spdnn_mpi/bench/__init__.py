"""Benchmarking: the challenge and model suites, peers, floors, published anchors, plots."""
