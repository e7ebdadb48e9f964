"""Spark checkpoint logic: read a live Structured Streaming checkpoint and plan a savepoint of it."""
