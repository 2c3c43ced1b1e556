#!/usr/bin/env python3
"""ducklake-kit harness entry point: `python ducklake_test.py --help` (the logic lives in src/ducklake_kit)."""

from ducklake_kit.cli import main

if __name__ == "__main__":
    main()
