"""`python -m mlm_tasks <step>`: see mlm_tasks/cli.py."""

import sys

from mlm_tasks.cli import main

sys.exit(main())
