"""TPU VM settings: the node, how it is asked for, how Airflow reaches it, and what runs on it."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, model_validator

from mlm_tasks.config.section import Section
from mlm_tasks.tpu import runtimes


class TpuConfig(Section):
    project: str = Field("", description="Google Cloud project of the TPU VM.")
    # A run may pick the zone, and it becomes part of the TPU API's resource path (and the janitor's
    # registry path): only the shape of a Google Cloud zone, e.g. us-central2-b, europe-west4-a.
    zone: str = Field(
        "us-central2-b",
        pattern=r"^[a-z]+(-[a-z]+[0-9]+)+-[a-z]$",
        description="Zone of the TPU VM, e.g. us-central2-b.",
    )
    accelerator_type: str = Field("v4-8", description="TPU type, e.g. v4-8, v5litepod-8, v4-32 (pod slice).")
    runtime_version: str = Field(
        runtimes.DEFAULT,
        json_schema_extra={"enum": [*sorted(runtimes.SUPPORTED)]},
        description="TPU VM software version: tpu-vm-tf-X.Y.Z[-pod]-pjrt (-pod for "
        "multi-host slices such as v4-32); picks the image's TensorFlow and the VM lock.",
    )
    network: str | None = Field(None, description="VPC network (default network if empty).")
    subnetwork: str | None = Field(None, description="Subnetwork.")
    # How the node is asked for. A new project has on-demand quota only; Spot and queued need their own.
    provisioning: Literal["on_demand", "spot", "queued"] = Field(
        "on_demand",
        description="on_demand: create the node (on-demand quota, fails on a stockout, which is waited out: "
        "tpu.stockout_wait_hours); spot: the same with Spot scheduling (cheaper, may be preempted); queued: a "
        "queued resource that waits in Google's queue for capacity (tpu.queued_tier, tpu.queued_valid_hours, "
        "tpu.reservation), deferred, holding no worker slot.",
    )
    queued_tier: Literal["spot", "guaranteed"] = Field(
        "spot", description="provisioning=queued: the Spot tier, or the guaranteed tier (on-demand prices)."
    )
    queued_valid_hours: float = Field(
        24,
        ge=0.1,
        le=720,
        description="provisioning=queued: how long the request may wait in the queue (validUntilDuration); "
        "then it fails and the task with it.",
    )
    reservation: str | None = Field(
        None,
        pattern=r"^projects/[^/]+/locations/[^/]+/reservations/[^/]+$",
        description="provisioning=queued, tier guaranteed: the reservation to provision from, "
        "projects/P/locations/Z/reservations/R.",
    )
    price_per_chip_hour: float | None = Field(
        None,
        gt=0,
        le=1000,
        description="US$ per chip-hour of the slice, for the "
        "cost estimates and the cost a run reports (empty: Google's list "
        "price for the generation, Spot or on-demand: mlm_tasks/tpu/prices.py).",
    )
    service_account: str | None = Field(None, description="Service account email for the VM.")
    ttl_hours: float = Field(12, gt=0, le=720, description="The janitor deletes the VM after this many hours.")
    api_endpoint: str | None = Field(None, description="TPU API endpoint override (tests: http://127.0.0.1:P).")
    transport: Literal["grpc", "rest"] = Field("grpc", description="TPU API client transport.")
    ssh_conn_id: str = Field("tpu_ssh", description="Airflow SSH connection (user, private key) for the VM.")
    ssh_port: int = Field(22, ge=1, le=65535, description="SSH port on the VM workers.")
    workdir: str = Field("~/mlm", description="Directory on the VM where the project is installed.")
    python: str = Field("python3", description="Python interpreter on the VM.")
    create_timeout_s: int = Field(
        1800, ge=60, le=86_400, description="Give up waiting for a READY node after this long."
    )
    poll_interval_s: float = Field(
        15, gt=0, le=3600, description="Seconds between TPU API checks while waiting for the node."
    )
    # A stockout passes with time, and creating again is free: it is waited out inside the task's try
    # (create_tpu_vm's, or train's when it replaces a lost node), so it never uses up Airflow's retries.
    stockout_wait_hours: float = Field(
        4,
        ge=0,
        le=168,
        description="How long to keep creating the node again while the zone has no capacity for the "
        "slice (a stockout), inside one try; 0: a stockout fails the try at once.",
    )
    stockout_retry_s: float = Field(
        300, gt=0, le=3600, description="Seconds between creates while the zone has no capacity."
    )
    api_timeout_s: float = Field(
        60,
        gt=0,
        le=600,
        description="Seconds one TPU API request may go unanswered before it "
        "fails (a hung API or network); busy answers (429, 503) are retried for 5 minutes.",
    )
    delete_timeout_s: int = Field(
        900,
        ge=1,
        le=86_400,
        description="Seconds the teardown waits for the deleted node to be gone; "
        "then it leaves the node to mlm_tpu_janitor and says so in its log.",
    )
    bootstrap: bool = Field(
        True,
        description="Install the staged project code on the VM before a step "
        "(off: the VM already has it in workdir, e.g. tests or a custom image).",
    )
    external_ips: bool = Field(
        True,
        description="Give the workers external IPs (as gcloud does; pip on the "
        "VM needs them unless the VPC has Cloud NAT).",
    )
    ssh_via: Literal["internal", "external"] = Field(
        "external",
        description="Which worker IPs Airflow dials for SSH: external (Airflow outside the VPC, e.g. "
        "docker compose on a laptop or VM elsewhere; needs external_ips) or internal (Airflow inside the "
        "VPC, e.g. Composer or a GCE VM on the same network).",
    )
    ssh_probe_timeout_s: float = Field(
        10,
        gt=0,
        le=600,
        description="Seconds to wait for port 22 of each worker once "
        "the node is READY; an unreachable worker fails the task at once.",
    )
    enable_oslogin: bool = Field(
        False,
        description="Node metadata enable-oslogin. False: the ssh-keys "
        "metadata (the tpu_ssh connection's key) lets Airflow log in; True: grant the "
        "key through OS Login instead (ssh-keys metadata is then ignored).",
    )
    env: dict[str, str] = Field(
        default_factory=dict,
        description="Environment variables for the step on every "
        "worker (no secrets: the config is logged and kept in XCom).",
    )

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
    def spot(self) -> bool:
        """Spot capacity (Spot prices, may be preempted): provisioning spot, or queued on the Spot tier."""
        return self.provisioning == "spot" or (self.provisioning == "queued" and self.queued_tier == "spot")

    def create_wait_s(self) -> float:
        """How long a create may take to give a READY node: the queue's validity, then the create itself."""
        queued = self.queued_valid_hours * 3600 if self.provisioning == "queued" else 0
        return queued + self.create_timeout_s

    @model_validator(mode="after")
    def _reservation_is_guaranteed(self) -> TpuConfig:
        if self.reservation and (self.provisioning, self.queued_tier) != ("queued", "guaranteed"):
            raise ValueError(
                "tpu.reservation is for tpu.provisioning=queued with tpu.queued_tier=guaranteed "
                f"(here {self.provisioning!r}, tier {self.queued_tier!r})."
            )
        return self

    @model_validator(mode="after")
    def _supported_runtime(self) -> TpuConfig:
        # The runtime picks the image's TensorFlow and so the VM lock (mlm_tasks.tpu.runtimes).
        runtimes.get(self.runtime_version)
        return self
