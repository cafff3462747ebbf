"""Cloud TPU VMs: the TPU API, slices and runtimes, the code bundle and remote command, the SSH runner and
the registry of nodes made. vm/ is what runs on the VM itself; the trainer's driver is mlm_tasks/job/.
"""
