"""`promptcache`: render, generate the CRD, run the operator or the cache front.

Bad input exits with status 2 and one line per problem naming the field; a
user never sees a traceback for a mistake in their YAML.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

from promptcache._version import __version__
from promptcache.api import InvalidResourceError
from promptcache.api.defaults import add_default_flags, defaults_from_args
from promptcache.yamlio import dump_all

EXIT_BAD_INPUT = 2


def _front_command() -> ModuleType:
    from promptcache.front import command

    return command


def _controller_command() -> ModuleType:
    from promptcache.controller import command

    return command


def _gateway_command() -> ModuleType:
    from promptcache.gateway import command

    return command


def _catalog_command() -> ModuleType:
    from promptcache.catalog import command

    return command


_PLANE_COMMANDS: tuple[tuple[str, Callable[[], ModuleType]], ...] = (
    ("promptcache.front", _front_command),
    ("promptcache.controller", _controller_command),
    ("promptcache.gateway", _gateway_command),
    ("promptcache.catalog", _catalog_command),
)
"""Sub-commands that live with their plane, each a `command` module with `register(sub)`.
Imported in functions, so `import promptcache.cli` stays light, and with plain import
statements, so the import contracts see every arrow from the CLI to a plane."""


def _fail(lines: Sequence[str]) -> int:
    for line in lines:
        print(f"error: {line}", file=sys.stderr)
    return EXIT_BAD_INPUT


def _file_name(index: int, manifest: dict[str, Any]) -> str:
    return f"{index:02d}-{manifest['kind'].lower()}-{manifest['metadata']['name']}.yaml"


def cmd_render(args: argparse.Namespace) -> int:
    from promptcache.loading import load_resources, read_text
    from promptcache.render import RenderError, names_of, render, resolved
    from promptcache.render.front import salt_secret

    try:
        defaults = defaults_from_args(args)
    except ValueError as error:
        return _fail([str(error)])
    try:
        resources = load_resources(read_text(args.file), source=args.file)
        deployed = [resolved(pcd, defaults) for pcd in resources]
        rendered = [(pcd, render(pcd)) for pcd in deployed]
    except InvalidResourceError as error:
        return _fail([str(p) for p in error.problems])
    except RenderError as error:
        return _fail([str(error)])
    for pcd, _ in rendered:
        names = names_of(pcd)
        secret = salt_secret(pcd, names)
        if (
            secret is not None
            and pcd.spec.isolation.salt_secret_ref is None
            and pcd.spec.front.enabled
        ):
            print(
                f"note: {names.namespace}/{names.instance} reads its salt key from Secret "
                f"{secret[0]!r} (key {secret[1]!r}). The operator creates it; without the "
                f"operator create it once: kubectl -n {names.namespace} create secret generic "
                f"{secret[0]} --from-literal={secret[1]}=$(openssl rand -hex 32)",
                file=sys.stderr,
            )
    if args.output_dir is None:
        sys.stdout.write(dump_all(m for _, manifests in rendered for m in manifests))
        return 0
    out = Path(args.output_dir)
    for pcd, manifests in rendered:
        folder = out / pcd.metadata.namespace / pcd.metadata.name
        folder.mkdir(parents=True, exist_ok=True)
        for index, manifest in enumerate(manifests):
            (folder / _file_name(index, manifest)).write_text(
                dump_all([manifest]), encoding="utf-8"
            )
        print(f"wrote {len(manifests)} manifests to {folder}", file=sys.stderr)
    return 0


def cmd_crd(args: argparse.Namespace) -> int:
    from promptcache.api.crd import custom_resource_definition

    sys.stdout.write(dump_all([custom_resource_definition()]))
    return 0


def cmd_docs(args: argparse.Namespace) -> int:
    from promptcache.api.reference import api_reference_markdown

    sys.stdout.write(api_reference_markdown())
    return 0


def cmd_version(args: argparse.Namespace) -> int:
    print(__version__)
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="promptcache",
        description="Prompt-cache-aware LLM serving on Kubernetes from one PromptCacheDeployment.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    render = sub.add_parser(
        "render", help="render a PromptCacheDeployment to Kubernetes manifests (no cluster needed)"
    )
    render.add_argument(
        "-f", "--file", required=True, help="YAML file with one or more resources, or - for stdin"
    )
    render.add_argument("-o", "--output-dir", help="write one file per manifest under this folder")
    add_default_flags(render)
    render.set_defaults(func=cmd_render)
    crd = sub.add_parser("crd", help="print the CustomResourceDefinition")
    crd.set_defaults(func=cmd_crd)
    docs = sub.add_parser("docs", help="print the API field reference as Markdown")
    docs.set_defaults(func=cmd_docs)
    version = sub.add_parser("version", help="print the version")
    version.set_defaults(func=cmd_version)
    for package, load in _PLANE_COMMANDS:
        try:
            module = load()
        except ModuleNotFoundError as error:
            if error.name and f"{package}.command".startswith(error.name):
                continue  # that plane is not part of this build
            raise
        module.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    result: int = args.func(args)
    return result


if __name__ == "__main__":
    sys.exit(main())
