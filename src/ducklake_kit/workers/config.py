"""Where the worker plane is, from the settings alone (no Dask import): the kit's own scheduler on loopback ports,
or a user's cluster given by --scheduler / DUCKLAKE_SCHEDULER. `connect` prints it without loading Dask."""

from __future__ import annotations

import os
from dataclasses import dataclass

from ducklake_kit.platforms.state import DEFAULT_DASHBOARD_PORT, DEFAULT_SCHEDULER_PORT, State

LOCAL_DB = "local"  # the worker-local in-memory database, attached beside the lake on every worker


@dataclass
class PlaneConfig:
    """Where the plane is: the kit's own scheduler on loopback ports, or a user's (`external_address`)."""

    scheduler_port: int
    dashboard_port: int
    external_address: str | None = None

    @classmethod
    def of(cls, state: State, scheduler: str | None = None) -> "PlaneConfig":
        saved = state.settings()
        address = scheduler or os.environ.get("DUCKLAKE_SCHEDULER") or None
        return cls(int(os.environ.get("DUCKLAKE_SCHEDULER_PORT") or saved.get("scheduler_port") or DEFAULT_SCHEDULER_PORT),
                   int(os.environ.get("DUCKLAKE_DASHBOARD_PORT") or saved.get("dashboard_port") or DEFAULT_DASHBOARD_PORT),
                   address)

    @property
    def address(self) -> str:
        return self.external_address or f"tcp://127.0.0.1:{self.scheduler_port}"

    @property
    def dashboard(self) -> str | None:
        return None if self.external_address else f"http://127.0.0.1:{self.dashboard_port}/status"
