"""Commands a person runs, outside the library: the real-cloud smoke test (`python -m mlm_tasks.commands.smoke`)."""
