"""What runs on the TPU VM itself before a step: the image check, with the VM locks beside it."""
