"""Operators of the pipeline: the TPU VM, train, a step over SSH on the VM, the release approval."""
