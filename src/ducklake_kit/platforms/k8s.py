"""Names and ports of the Kubernetes (k3d) platform: the one place the harness and the manifests agree on.

The manifests under databases/ and overlays/ spell these names as literals (Kustomize has no variables);
tests/platforms/test_manifests.py renders them and fails if a name or port here and there disagree. Pure constants:
no kubectl calls in this module.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path, PurePosixPath

from ducklake_kit.platforms.base import CATALOG_DB

# The k3d cluster. k3d names the kubeconfig context "k3d-<cluster>"; pass it to every kubectl call
# (`kubectl --context ...`) so the kit never acts on whatever cluster the user's kubeconfig points at.
CLUSTER_NAME = "ducklake"
KUBE_CONTEXT = f"k3d-{CLUSTER_NAME}"

# Everything the kit runs lives in one namespace (set by base/, a Kustomize Component).
NAMESPACE = "ducklake"

# PostgreSQL: the catalog. StatefulSet and Service share the name; port-forward `svc/postgres`.
POSTGRES_SERVICE = "postgres"
POSTGRES_STATEFULSET = "postgres"
POSTGRES_PORT = 5432
POSTGRES_SELECTOR = "app.kubernetes.io/name=postgres"  # `kubectl get pods -l ...`, `kubectl logs -l ...`
POSTGRES_DB = CATALOG_DB

# rclone serve s3: the lake's object storage (buckets raw and lake). Port-forward `svc/rclone-s3`.
S3_SERVICE = "rclone-s3"
S3_STATEFULSET = "rclone-s3"
S3_PORT = 9000
S3_SELECTOR = "app.kubernetes.io/name=rclone-s3"

# The credentials Secret. The overlay's secretGenerator names it; the rendered name carries a content hash
# suffix (ducklake-credentials-<hash>), so look it up by this prefix or by the workloads' secretKeyRef.
SECRET_NAME = "ducklake-credentials"
SECRET_KEYS = ("POSTGRES_USER", "POSTGRES_PASSWORD", "S3_KEY_ID", "S3_SECRET")

# Paths relative to the repository root (POSIX form, as kubectl and k3d take them on every OS).
OVERLAY = PurePosixPath("overlays/local")  # `kubectl apply -k overlays/local`
SECRETS_ENV = OVERLAY / "secrets.env"  # gitignored; written by the harness, read by the secretGenerator
K3D_CONFIG = OVERLAY / "k3d-cluster.yaml"  # `k3d cluster create --config overlays/local/k3d-cluster.yaml`

# Kustomize's env-file reader keeps a value byte for byte (quotes, '#', '=' and blanks included: checked with
# kubectl 1.37.1); only a line break cannot be carried.
_ONE_LINE = re.compile(r"^[^\r\n\x00]+$")


def secrets_env_text(values: Mapping[str, str]) -> str:
    """The content of SECRETS_ENV for these credentials: one KEY=value a line, keys exactly SECRET_KEYS.

    Raises ValueError for a missing or unknown key, or an empty value or one with a line break.
    """
    missing = [k for k in SECRET_KEYS if k not in values]
    unknown = sorted(set(values) - set(SECRET_KEYS))
    if missing or unknown:
        raise ValueError(f"secrets.env needs exactly {', '.join(SECRET_KEYS)}; missing {missing}, unknown {unknown}")
    for key in SECRET_KEYS:
        if not _ONE_LINE.match(values[key]):
            raise ValueError(f"{key}: value must be non-empty and on one line")
    return "".join(f"{key}={values[key]}\n" for key in SECRET_KEYS)


def repo_path(root: Path, relative: PurePosixPath) -> Path:
    """One of the relative paths above, under a repository root."""
    return root.joinpath(*relative.parts)
