"""Where the worker plane is, from the settings alone (no Dask import): the kit's own scheduler on loopback ports,
or a user's cluster given by --scheduler / DUCKLAKE_SCHEDULER. `connect` prints it without loading Dask.

The kit's own plane speaks TLS with the certificates of its state folder (workers/tls.py); a user's cluster is
reached with the TLS files DUCKLAKE_SCHEDULER_TLS_* or Dask's config name, or in plain TCP when its address is
tcp://. Each configuration is remembered by its address, so that a `WorkerPlane(address, ...)` made anywhere in this
process finds the certificate that goes with it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from ducklake_kit.platforms.state import DEFAULT_DASHBOARD_PORT, DEFAULT_SCHEDULER_PORT, State
from ducklake_kit.workers.tls import ClientTLS, check_user_settings

LOCAL_DB = "local"  # the worker-local in-memory database, attached beside the lake on every worker

_KNOWN: dict[str, ClientTLS | None] = {}  # address -> the client TLS files it is reached with (None: plain TCP)


@dataclass
class PlaneConfig:
    """Where the plane is: the kit's own scheduler on loopback ports, or a user's (`external_address`)."""

    scheduler_port: int
    dashboard_port: int
    external_address: str | None = None
    tls: ClientTLS | None = None  # the client's TLS files (the kit's own, or those given for a user's cluster)

    @classmethod
    def of(cls, state: State, scheduler: str | None = None) -> PlaneConfig:
        saved = state.settings()
        address = scheduler or os.environ.get("DUCKLAKE_SCHEDULER") or None
        if address:
            tls = ClientTLS.from_env()
            if tls is None and address.startswith("tls://"):
                tls = ClientTLS.from_dask_config()
            check_user_settings(address, tls)
        else:
            tls = ClientTLS.of_kit(state)
        cfg = cls(
            int(os.environ.get("DUCKLAKE_SCHEDULER_PORT") or saved.get("scheduler_port") or DEFAULT_SCHEDULER_PORT),
            int(os.environ.get("DUCKLAKE_DASHBOARD_PORT") or saved.get("dashboard_port") or DEFAULT_DASHBOARD_PORT),
            address,
            tls,
        )
        _KNOWN[cfg.address] = cfg.tls
        return cfg

    @property
    def address(self) -> str:
        return self.external_address or f"tls://127.0.0.1:{self.scheduler_port}"

    @property
    def dashboard(self) -> str | None:
        return None if self.external_address else f"http://127.0.0.1:{self.dashboard_port}/status"

    def security(self):
        """Dask's Security for a client of this plane (None: plain TCP to a user's tcp:// cluster)."""
        return self.tls.security() if self.tls else None


def security_for(address: str):
    """The Security a client of `address` connects with: the one its PlaneConfig gave, else (a tls:// address this
    process never configured) the files DUCKLAKE_SCHEDULER_TLS_* or Dask's config name."""
    if address in _KNOWN:
        tls = _KNOWN[address]
    elif address.startswith("tls://"):
        tls = ClientTLS.from_env() or ClientTLS.from_dask_config()
        check_user_settings(address, tls)
    else:
        tls = None
    return tls.security() if tls else None
