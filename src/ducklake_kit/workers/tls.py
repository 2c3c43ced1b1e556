"""The worker plane's mutual TLS: a certificate authority made for one state folder, and the scheduler's, the
workers' and the clients' certificates it signed. With them the plane speaks `tls://` only (Dask's
`require-encryption`), and both ends of every connection show a certificate of this CA: a local user without the
client certificate is refused at the handshake, before any message reaches the scheduler.

The files live in `<state>/tls/`, 0600 each, and reach the processes by their paths in the environment (Dask's
`distributed.comm.tls.*` config), never on a command line. The CA's private key is not kept: `up` makes a new CA
and new certificates when one is missing or about to expire, and restarts a plane that runs with the old ones.
When the kit runs as root the scheduler and workers run as the service user: they own their own key and
certificate and the CA certificate; the client key stays root's.

A user's own cluster (`--scheduler tls://...`) brings its own files: `ClientTLS` from DUCKLAKE_SCHEDULER_TLS_CA,
_CERT and _KEY, or from Dask's own config.
"""

from __future__ import annotations

import datetime
import hashlib
import os
import pwd
from dataclasses import dataclass
from pathlib import Path

from ducklake_kit.errors import KitError
from ducklake_kit.platforms.state import State, write_private

ROLES = ("scheduler", "worker", "client")
VALID_DAYS = 825  # the longest lifetime TLS clients accept for a leaf certificate
RENEW_BEFORE = datetime.timedelta(days=7)  # a certificate this close to its end is made anew at `up`


def tls_dir(state: State) -> Path:
    return state.home / "tls"


def _paths(state: State, role: str) -> tuple[Path, Path]:
    folder = tls_dir(state)
    return folder / f"{role}.crt", folder / f"{role}.key"


def ca_file(state: State) -> Path:
    return tls_dir(state) / "ca.crt"


@dataclass(frozen=True)
class ClientTLS:
    """A client's TLS files: the CA that signed the scheduler's certificate, and the client's certificate and key."""

    ca_file: str
    cert: str
    key: str | None = None

    def security(self):
        from distributed.security import Security  # Dask loads only with the commands that use the plane

        return Security(
            tls_ca_file=self.ca_file, tls_client_cert=self.cert, tls_client_key=self.key, require_encryption=True
        )

    @classmethod
    def of_kit(cls, state: State) -> ClientTLS:
        cert, key = _paths(state, "client")
        return cls(str(ca_file(state)), str(cert), str(key))

    @classmethod
    def from_env(cls) -> ClientTLS | None:
        """DUCKLAKE_SCHEDULER_TLS_CA, _CERT and _KEY (the key may sit in the certificate's file): a user's cluster."""
        ca, cert = os.environ.get("DUCKLAKE_SCHEDULER_TLS_CA"), os.environ.get("DUCKLAKE_SCHEDULER_TLS_CERT")
        key = os.environ.get("DUCKLAKE_SCHEDULER_TLS_KEY") or None
        if not (ca or cert or key):
            return None
        if not (ca and cert):
            raise KitError(
                "DUCKLAKE_SCHEDULER_TLS_CA and DUCKLAKE_SCHEDULER_TLS_CERT go together",
                "set both (and DUCKLAKE_SCHEDULER_TLS_KEY unless the key is in the certificate's file)",
            )
        return cls(ca, cert, key)

    @classmethod
    def from_dask_config(cls) -> ClientTLS | None:
        """The client TLS files a Dask config names (`distributed.comm.tls.ca-file`, `.client.cert`, `.client.key`),
        from Dask's YAML files or DASK_DISTRIBUTED__COMM__TLS__* in the environment."""
        import dask.config

        ca = dask.config.get("distributed.comm.tls.ca-file", None)
        cert = dask.config.get("distributed.comm.tls.client.cert", None)
        return cls(ca, cert, dask.config.get("distributed.comm.tls.client.key", None)) if ca and cert else None


def fingerprint(state: State) -> str | None:
    """The CA certificate's SHA-256 (what the running plane was started with, compared at `up`)."""
    try:
        return hashlib.sha256(ca_file(state).read_bytes()).hexdigest()
    except FileNotFoundError:
        return None


def ensure_certificates(state: State, run_as: str | None) -> bool:
    """Make the CA and the three certificates when any is missing or near its end (True: made anew). Each file is
    0600; with `run_as` the scheduler's and workers' files and the CA certificate belong to that user."""
    if _all_valid(state):
        _give(state, run_as)
        return False
    folder = tls_dir(state)
    folder.mkdir(parents=True, exist_ok=True)
    # traversable by the service user (who reads its own files by name), listable by the kit's user only
    os.chmod(folder, 0o711 if run_as else 0o700)
    ca_key, ca_cert = _make_ca()
    write_private(ca_file(state), _pem_cert(ca_cert))
    for role in ROLES:
        key, cert = _make_leaf(ca_key, ca_cert, role)
        cert_path, key_path = _paths(state, role)
        write_private(key_path, _pem_key(key))
        write_private(cert_path, _pem_cert(cert))
    _give(state, run_as)
    return True


def _give(state: State, run_as: str | None) -> None:
    if not run_as:
        return
    entry = pwd.getpwnam(run_as)
    for path in [ca_file(state), *_paths(state, "scheduler"), *_paths(state, "worker")]:
        if path.stat().st_uid != entry.pw_uid:
            os.chown(path, entry.pw_uid, entry.pw_gid)


def _all_valid(state: State) -> bool:
    from cryptography import x509

    files = [ca_file(state), *(p for role in ROLES for p in _paths(state, role))]
    if not all(p.exists() for p in files):
        return False
    try:
        ca = x509.load_pem_x509_certificate(ca_file(state).read_bytes())
        soon = datetime.datetime.now(datetime.UTC) + RENEW_BEFORE
        for role in ROLES:
            cert = x509.load_pem_x509_certificate(_paths(state, role)[0].read_bytes())
            cert.verify_directly_issued_by(ca)
            if cert.not_valid_after_utc < soon:
                return False
        return ca.not_valid_after_utc >= soon
    except (ValueError, TypeError):  # unreadable, or not signed by this CA: make them anew
        return False


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


def _new_key():
    from cryptography.hazmat.primitives.asymmetric import ec

    return ec.generate_private_key(ec.SECP256R1())  # P-256: made in a millisecond, accepted by every TLS stack


def _name(common_name: str):
    from cryptography import x509
    from cryptography.x509.oid import NameOID

    return x509.Name(
        [
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, "ducklake-kit"),
            x509.NameAttribute(NameOID.COMMON_NAME, common_name),
        ]
    )


def _make_ca():
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes

    key = _new_key()
    name = _name("ducklake-kit worker plane CA")
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(_now() - datetime.timedelta(minutes=5))
        .not_valid_after(_now() + datetime.timedelta(days=VALID_DAYS))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=False,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    return key, cert


def _make_leaf(ca_key, ca_cert, role: str):
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes
    from cryptography.x509.oid import ExtendedKeyUsageOID

    key = _new_key()
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name(f"dask-{role}"))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(_now() - datetime.timedelta(minutes=5))
        .not_valid_after(_now() + datetime.timedelta(days=VALID_DAYS))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        # every Dask process both serves (its listener) and connects (to the scheduler, to other workers)
        .add_extension(
            x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False
        )
        .add_extension(
            x509.SubjectAlternativeName([x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
            critical=False,
        )
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    return key, cert


def _pem_cert(cert) -> str:
    from cryptography.hazmat.primitives import serialization

    return cert.public_bytes(serialization.Encoding.PEM).decode()


def _pem_key(key) -> str:
    from cryptography.hazmat.primitives import serialization

    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    ).decode()


def process_env(state: State, role: str) -> dict[str, str]:
    """What a kit-started scheduler or worker needs to speak TLS only: its files by path, in Dask's config."""
    cert, key = _paths(state, role)
    return {
        "DASK_DISTRIBUTED__COMM__REQUIRE_ENCRYPTION": "True",
        "DASK_DISTRIBUTED__COMM__TLS__CA_FILE": str(ca_file(state)),
        f"DASK_DISTRIBUTED__COMM__TLS__{role.upper()}__CERT": str(cert),
        f"DASK_DISTRIBUTED__COMM__TLS__{role.upper()}__KEY": str(key),
    }


def check_user_settings(address: str, tls: ClientTLS | None) -> None:
    """A user's scheduler: TLS settings go with a tls:// address, and only with one."""
    if address.startswith("tls://") and tls is None:
        raise KitError(
            f"the Dask scheduler at {address} speaks TLS but no TLS settings were given",
            "set DUCKLAKE_SCHEDULER_TLS_CA, DUCKLAKE_SCHEDULER_TLS_CERT and DUCKLAKE_SCHEDULER_TLS_KEY to "
            "the cluster's CA and a client certificate and key (or Dask's distributed.comm.tls config)",
        )
    if tls is not None and not address.startswith("tls://"):
        raise KitError(
            f"TLS settings were given but the Dask scheduler address {address} is not tls://",
            f"give it as tls://{address.split('://', 1)[-1]}, or drop the TLS settings",
        )
    if tls is not None:
        for path in (tls.ca_file, tls.cert, tls.key):
            if path and not Path(path).is_file():
                raise KitError(
                    f"the TLS file {path} for the Dask scheduler does not exist",
                    "check DUCKLAKE_SCHEDULER_TLS_CA, DUCKLAKE_SCHEDULER_TLS_CERT and DUCKLAKE_SCHEDULER_TLS_KEY",
                )
