"""A prerequisite as `doctor` reports it: found or not, its version, whether this platform needs it, how to install
it. Its own module so that doctor and the platforms' own checks (podman_doctor) share it without importing each
other."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class Tool:
    name: str
    found: bool
    version: str
    required: bool
    hint: str
    why: str

    @property
    def ok(self) -> bool:
        return self.found or not self.required

    def as_dict(self) -> dict:
        return {
            "name": self.name,
            "found": self.found,
            "version": self.version,
            "required": self.required,
            "ok": self.ok,
            "hint": self.hint,
            "why": self.why,
        }
