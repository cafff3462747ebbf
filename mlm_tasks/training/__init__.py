"""Training around the model: the plan (`plan`: device, precision, strategy, batch, steps; `device`,
`budget`), the parts `steps/train.py` chains (`step`, `state`, `loop`, `hooks`), what it records while it
runs (`progress`, `validation`, `status`), and what a detached trainer's state means (`follow`)."""
