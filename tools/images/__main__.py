"""`scripts/images`: build (or reuse) every image of the project; save or push them."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from tools.images.build import TARGETS, ensure_images, push, save
from tools.images.host import ImagesError, Progress


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="scripts/images",
        description="Build the project's images from the Dockerfile with podman, cached by "
        "their inputs (a second run takes seconds); tagged localhost/promptcache-TARGET:VERSION.",
    )
    parser.add_argument(
        "--target",
        action="append",
        choices=TARGETS,
        help="build only this target (repeatable; default: all)",
    )
    parser.add_argument("--save", metavar="DIR", type=Path, help="write OCI archives to DIR")
    parser.add_argument(
        "--push",
        metavar="REGISTRY",
        help="push as REGISTRY/promptcache-TARGET:VERSION (log in first: podman login)",
    )
    parser.add_argument(
        "--insecure", action="store_true", help="push over plain HTTP or unverified TLS"
    )
    args = parser.parse_args(argv)
    progress = Progress()
    try:
        images = ensure_images(args.target or TARGETS, progress)
        for built in images.values():
            if args.save:
                save(built, args.save, progress)
            if args.push:
                push(built, args.push, progress, tls_verify=not args.insecure)
    except ImagesError as error:
        print(f"scripts/images: {error}", file=sys.stderr)
        return 2
    for built in images.values():
        print(
            f"{built.ref}  {built.size_bytes / 1e6:,.0f} MB  (torch: {built.torch_index})"
            if built.target == "front"
            else f"{built.ref}  {built.size_bytes / 1e6:,.0f} MB"
        )
    print("steps:\n" + progress.summary())
    return 0


if __name__ == "__main__":
    sys.exit(main())
