"""`python -m mlm_tasks <step>`: see mlm_tasks/cli.py."""

from mlm_tasks.cli import main

raise SystemExit(main())
