"""The base of every settings section, and the mark of the settings only the deployment may set.

    class TpuConfig(Section):
        project: DeploymentOnly[str] = Field("", description="...")

`mlm_tasks.config.deployment` derives its key list from the marks (`deployment_keys`).
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)
