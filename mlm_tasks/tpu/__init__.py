"""Cloud TPU VMs: the TPU API, slices and runtimes, the code bundle and remote command, the SSH runner,
the registry of nodes made, and the real-cloud smoke test. vm/ is what runs on the VM itself.
"""
