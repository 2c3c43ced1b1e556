"""The service user: when the kit runs as root, PostgreSQL, the worker plane's scheduler and its workers run as the
system user `ducklake` instead (PostgreSQL refuses root; a Dask task must not run as root).

That user must be able to run the kit's Python. Where the interpreter sits in a folder only root may enter (pyenv
under /root, 0700), the kit grants the service user alone the right to pass through that folder (a POSIX ACL entry
`user:ducklake:--x`: no listing, no reading of anything not already readable, nothing for other users), and says so.
"""

from __future__ import annotations

import errno
import os
import pwd
import struct
import subprocess
import sys
from pathlib import Path

from ducklake_kit.errors import KitError

SERVICE_USER = "ducklake"
_ACL = "system.posix_acl_access"
# the kernel's ACL xattr layout (linux/posix_acl_xattr.h): a version, then (tag, perm, id) entries sorted by tag and id
_ACL_VERSION = 2
_USER_OBJ, _USER, _GROUP_OBJ, _MASK, _OTHER = 0x01, 0x02, 0x04, 0x10, 0x20
_NO_ID = 0xFFFFFFFF


def service_user() -> str | None:
    """The user services run as when the kit runs as root (created if missing); None when the kit is not root."""
    if os.geteuid() != 0:
        return None
    try:
        pwd.getpwnam(SERVICE_USER)
    except KeyError:
        subprocess.run(
            ["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", SERVICE_USER],
            check=True,
            capture_output=True,
        )
    return SERVICE_USER


def _entries(path: Path) -> list[tuple[int, int, int]]:
    """The folder's ACL entries; from its mode bits when it has no ACL."""
    try:
        raw = os.getxattr(path, _ACL)
    except OSError as exc:
        if exc.errno != errno.ENODATA:
            raise
        mode = path.stat().st_mode
        return [(_USER_OBJ, (mode >> 6) & 7, _NO_ID), (_GROUP_OBJ, (mode >> 3) & 7, _NO_ID), (_OTHER, mode & 7, _NO_ID)]
    return [struct.unpack_from("<HHI", raw, offset) for offset in range(4, len(raw), 8)]


def _may_pass(path: Path, uid: int) -> bool:
    st = path.stat()
    if st.st_uid == uid or st.st_mode & 0o001:
        return True
    entries = _entries(path)
    mask = next((perm for tag, perm, _ in entries if tag == _MASK), 7)
    return any(tag == _USER and ident == uid and perm & mask & 1 for tag, perm, ident in entries)


def grant_traverse(path: Path, uid: int) -> None:
    """Add `user:<uid>:--x` to the folder's ACL (keeping every other entry), with a mask that lets it through."""
    entries = [e for e in _entries(path) if not (e[0] == _USER and e[2] == uid)]
    entries.append((_USER, 1, uid))
    group = next(perm for tag, perm, _ in entries if tag == _GROUP_OBJ)
    old_mask = next((perm for tag, perm, _ in entries if tag == _MASK), group)
    entries = [e for e in entries if e[0] != _MASK] + [(_MASK, old_mask | 1, _NO_ID)]
    entries.sort(key=lambda e: (e[0], e[2]))
    os.setxattr(path, _ACL, struct.pack("<I", _ACL_VERSION) + b"".join(struct.pack("<HHI", *e) for e in entries))


def check_reachable(path: Path, user: str, who: str) -> None:
    """`who` runs as `user` and needs `path`: every folder above it must let that user through."""
    uid = pwd.getpwnam(user).pw_uid
    for parent in reversed(path.parents):
        if not _may_pass(parent, uid):
            raise KitError(
                f"{who} runs as user '{user}' (the kit runs as root) and cannot enter {parent}",
                f"`chmod o+x {parent}` or set DUCKLAKE_HOME to a folder whose parents others can traverse",
            )


def make_python_reachable(user: str) -> list[str]:
    """Let `user` run this Python and import the kit: grant it passage through each folder on the way that it may not
    enter. Returns the folders granted (empty when nothing was needed)."""
    uid = pwd.getpwnam(user).pw_uid
    targets = {
        Path(sys.executable).resolve(),
        Path(sys.base_prefix).resolve(),
        Path(sys.prefix).resolve(),
        Path(__file__).resolve(),
    }
    folders = sorted({parent for t in targets for parent in t.parents})
    granted = []
    for folder in folders:
        if _may_pass(folder, uid):
            continue
        try:
            grant_traverse(folder, uid)
        except OSError as exc:
            raise KitError(
                f"the service user '{user}' cannot enter {folder}, on the way to the kit's Python "
                f"{sys.executable}, and an ACL could not be set there ({exc.strerror})",
                f"let it pass (`setfacl -m u:{user}:x {folder}`, or `chmod o+x {folder}`), or install "
                "Python and the kit outside that folder",
            ) from None
        granted.append(str(folder))
    return granted
