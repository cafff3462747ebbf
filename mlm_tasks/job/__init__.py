"""The detached trainer on a TPU VM: launch, status, preemption, restarts, follow, and the one decision (decide)."""
