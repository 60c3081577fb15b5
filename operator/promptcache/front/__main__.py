"""`python -m promptcache.front`: the `front` sub-command without the full CLI."""

from __future__ import annotations

import argparse
import sys

from promptcache.front.command import add_arguments, run


def main(argv: list[str] | None = None) -> int:
    """Parse flags and run the front."""
    parser = argparse.ArgumentParser(prog="python -m promptcache.front")
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
