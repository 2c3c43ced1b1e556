"""`python -m ducklake_kit.console FOLDER`: the console's server, as `platforms.console.start` runs it."""

import sys

from ducklake_kit.console.server import main

if __name__ == "__main__":
    main(sys.argv[1])
