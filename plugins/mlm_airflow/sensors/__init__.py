"""Sensors of the pipeline: the shard gate."""
