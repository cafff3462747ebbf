"""The detached trainer on a TPU VM: its launch (`launch`), status record (`status`), preemption notice
(`preemption`), restarts (`restarts`), what its state means (`follow`), and the one decision function both
front ends call, the Airflow train task and the smoke command (`decide`)."""
