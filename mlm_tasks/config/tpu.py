"""TPU VM settings: the node, how it is asked for, how Airflow reaches it, and what runs on it."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, model_validator

from mlm_tasks.config.section import DeploymentOnly, Section
from mlm_tasks.tpu import runtimes


class TpuConfig(Section):
    project: DeploymentOnly[str] = Field("", description="Google Cloud project of the TPU VM.")
    # A run picks the zone, and it goes into the TPU API's and the janitor's paths: only a zone's shape.
    zone: str = Field("us-central2-b", pattern=r"^[a-z]+(-[a-z]+[0-9]+)+-[a-z]$", description="Zone of the TPU VM.")
    accelerator_type: str = Field("v4-8", description="TPU type, e.g. v4-8, v5litepod-8, v4-32 (pod slice).")
    runtime_version: str = Field(
        runtimes.DEFAULT, json_schema_extra={"enum": [*sorted(runtimes.SUPPORTED)]}, description="TPU VM software."
    )
    network: DeploymentOnly[str | None] = Field(None, description="VPC network (default network if empty).")
    subnetwork: DeploymentOnly[str | None] = Field(None, description="Subnetwork.")
    provisioning: Literal["on_demand", "spot", "queued"] = Field("on_demand", description="How the node is asked for.")
    queued_tier: Literal["spot", "guaranteed"] = Field("spot", description="provisioning=queued: spot or guaranteed.")
    queued_valid_hours: float = Field(24, ge=0.1, le=720, description="provisioning=queued: hours it may wait.")
    reservation: str | None = Field(
        None, pattern=r"^projects/[^/]+/locations/[^/]+/reservations/[^/]+$", description="For the guaranteed tier."
    )
    price_per_chip_hour: float | None = Field(None, gt=0, le=1000, description="US$ per chip-hour (empty: list price).")
    service_account: DeploymentOnly[str | None] = Field(None, description="Service account email for the VM.")
    ttl_hours: float = Field(12, gt=0, le=720, description="The janitor deletes the VM after this many hours.")
    api_endpoint: DeploymentOnly[str | None] = Field(None, description="TPU API endpoint override (tests).")
    transport: DeploymentOnly[Literal["grpc", "rest"]] = Field("grpc", description="TPU API client transport.")
    ssh_conn_id: DeploymentOnly[str] = Field("tpu_ssh", description="SSH connection (user, private key) for the VM.")
    ssh_port: DeploymentOnly[int] = Field(22, ge=1, le=65535, description="SSH port on the VM workers.")
    workdir: DeploymentOnly[str] = Field("~/mlm", description="Directory on the VM where the project is installed.")
    python: DeploymentOnly[str] = Field("python3", description="Python interpreter on the VM.")
    create_timeout_s: int = Field(1800, ge=60, le=86_400, description="Give up on a READY node after this.")
    poll_interval_s: float = Field(15, gt=0, le=3600, description="Seconds between node checks.")
    stockout_wait_hours: float = Field(4, ge=0, le=168, description="How long a stockout is waited out.")
    delete_timeout_s: int = Field(900, ge=1, le=86_400, description="Seconds the teardown waits for a deletion.")
    bootstrap: DeploymentOnly[bool] = Field(True, description="Install the project code on the VM.")
    external_ips: DeploymentOnly[bool] = Field(True, description="Give the workers external IPs.")
    ssh_via: DeploymentOnly[Literal["internal", "external"]] = Field("external", description="Worker IPs SSH dials.")
    enable_oslogin: DeploymentOnly[bool] = Field(False, description="Log in through OS Login, not ssh-keys.")
    env: DeploymentOnly[dict[str, str]] = Field(default_factory=dict, description="The step's environment, no secrets.")

    @model_validator(mode="before")
    @classmethod
    def _spot_means_provisioning(cls, data: Any) -> Any:
        # `tpu.spot: true|false` (before tpu.provisioning) still reads as it did.
        if isinstance(data, dict) and "spot" in data:
            data = dict(data)
            spot = data.pop("spot")
            asked = "spot" if spot else "on_demand"
            if data.get("provisioning", asked) != asked:
                raise ValueError(
                    f"tpu.spot={spot} and tpu.provisioning={data['provisioning']!r} disagree: "
                    "set tpu.provisioning only (on_demand, spot or queued)."
                )
            data["provisioning"] = asked
        return data

    @property
    def stockout_retry_s(self) -> float:
        """Seconds between creates while the zone has no capacity: every 20 node polls (derived: no run turns it)."""
        return self.poll_interval_s * 20

    @property
    def spot(self) -> bool:
        """Spot capacity (Spot prices, may be preempted): provisioning spot, or queued on the Spot tier."""
        return self.provisioning == "spot" or (self.provisioning == "queued" and self.queued_tier == "spot")

    def create_wait_s(self) -> float:
        """How long a create may take to give a READY node: the queue's validity, then the create itself."""
        queued = self.queued_valid_hours * 3600 if self.provisioning == "queued" else 0
        return queued + self.create_timeout_s

    @model_validator(mode="after")
    def _reservation_and_runtime(self) -> TpuConfig:
        if self.reservation and (self.provisioning, self.queued_tier) != ("queued", "guaranteed"):
            raise ValueError(
                "tpu.reservation is for tpu.provisioning=queued with tpu.queued_tier=guaranteed "
                f"(here {self.provisioning!r}, tier {self.queued_tier!r})."
            )
        runtimes.get(self.runtime_version)  # a known runtime: it picks the image's TensorFlow and so the VM lock
        return self
