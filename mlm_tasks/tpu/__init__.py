"""Cloud TPU VMs: the TPU API, slices, runtimes, the code bundle, SSH and the registry (vm/: what runs on the VM)."""
