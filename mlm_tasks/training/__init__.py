"""Training around the model: the plan (`plan`: device, precision, strategy, batch, steps; `device`,
`budget`), the parts `steps/train.py` chains (`step`, `state`, `loop`, `hooks`) and what it records while it
runs (`progress`, `validation`). The detached trainer's status record and driver: mlm_tasks/job/."""
