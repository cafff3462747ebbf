"""The figures a test records in its output (time to recover, steps lost, slot-seconds), one line each as
they come, and all of them as one JSON line when the module's stack shuts down.

    figure = Figures("durable")
    figure("restart to the next progress line s", 9.0)    # [durable figure] restart to ...: 9.0
    figure.dump()                                          # [durable figures] {"restart to ...": 9.0}
"""

from __future__ import annotations

import json


class Figures:
    def __init__(self, label: str) -> None:
        self.label = label
        self.values: dict[str, object] = {}

    def __call__(self, name: str, value: object) -> None:
        self.values[name] = value
        print(f"\n[{self.label} figure] {name}: {value}", flush=True)

    def dump(self) -> None:
        print(f"\n[{self.label} figures] " + json.dumps(self.values), flush=True)
