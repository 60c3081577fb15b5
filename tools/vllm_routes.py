"""vLLM's HTTP route table, read out of vLLM's own source (its wheel), without importing it.

The cache front classifies every route of the vLLM release the renderer
deploys (`promptcache.tenancy.routes`). This tool fetches that release's wheel
once per machine (`pip download --no-deps`, ~340 MB) into the project cache,
keyed by version, and lists its routes by parsing the API-server sources with
`ast` (vLLM's dependencies are not installed, so it cannot be imported):

    python tools/vllm_routes.py            # fetch if needed, print METHOD PATH lines
    python tools/vllm_routes.py --fetch    # only make sure the wheel is cached (bootstrap)

`tests/front/test_front_routes.py` uses the same functions and fails when a
route is missing from the front's table.
"""

from __future__ import annotations

import argparse
import ast
import os
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from promptcache.tenancy.routes import VLLM_ROUTES_VERSION

ROOT = Path(__file__).resolve().parent.parent

_DECORATOR_METHODS = {
    "get": "GET",
    "post": "POST",
    "put": "PUT",
    "delete": "DELETE",
    "patch": "PATCH",
    "head": "HEAD",
    "options": "OPTIONS",
    "websocket": "GET",  # a websocket starts as a GET upgrade
}
FASTAPI_DEFAULT_ROUTES = frozenset(
    {
        ("GET", "/docs"),
        ("GET", "/docs/oauth2-redirect"),
        ("GET", "/redoc"),
        ("GET", "/openapi.json"),
    }
)
"""Routes FastAPI itself adds to vLLM's app unless `--disable-fastapi-docs` (launchers/app.py)."""


def cache_dir() -> Path:
    """The project's machine-wide cache (as scripts/bootstrap uses it)."""
    return Path(os.environ.get("PROMPTCACHE_CACHE_DIR", Path.home() / ".cache" / "promptcache"))


def ensure_wheel(version: str = VLLM_ROUTES_VERSION) -> Path:
    """The cached vLLM wheel of `version`, downloaded (without dependencies) if absent."""
    target = cache_dir() / f"vllm-wheel-{version}"
    found = sorted(target.glob(f"vllm-{version}-*.whl"))
    if found:
        return found[0]
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent, prefix=".vllm-wheel-") as tmp:
        print(f"vllm_routes: downloading vllm=={version} (no dependencies) once", file=sys.stderr)
        subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "download",
                "--quiet",
                "--no-deps",
                "--progress-bar",
                "off",
                f"vllm=={version}",
                "-d",
                tmp,
            ],
            check=True,
            stdout=sys.stderr,
        )
        wheels = sorted(Path(tmp).glob(f"vllm-{version}-*.whl"))
        if not wheels:
            raise RuntimeError(f"pip download vllm=={version} produced no wheel")
        target.mkdir(exist_ok=True)
        final = target / wheels[0].name
        os.replace(wheels[0], final)
    return final


def _receiver_is_router(node: ast.expr) -> bool:
    name = node.id if isinstance(node, ast.Name) else None
    return name is not None and (name in ("app", "router") or name.endswith("_router"))


def _methods_kw(call: ast.Call, default: tuple[str, ...]) -> tuple[str, ...]:
    for kw in call.keywords:
        if kw.arg == "methods" and isinstance(kw.value, ast.List | ast.Tuple | ast.Set):
            return tuple(str(e.value).upper() for e in kw.value.elts if isinstance(e, ast.Constant))
    return default


def _path_arg(call: ast.Call) -> str | None:
    arg = call.args[0] if call.args else None
    if arg is None:
        arg = next((kw.value for kw in call.keywords if kw.arg == "path"), None)
    if isinstance(arg, ast.Constant) and isinstance(arg.value, str) and arg.value.startswith("/"):
        return arg.value
    return None


def routes_in_source(source: str) -> set[tuple[str, str]]:
    """(METHOD, path template) of every route one module declares."""
    found: set[tuple[str, str]] = set()
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        path = _path_arg(node)
        if path is None:
            continue
        if isinstance(func, ast.Name) and func.id == "Mount":
            found.add(("GET", path))
            continue
        if not isinstance(func, ast.Attribute) or not _receiver_is_router(func.value):
            continue
        if func.attr in _DECORATOR_METHODS:
            found.add((_DECORATOR_METHODS[func.attr], path))
        elif func.attr in ("api_route", "add_api_route", "add_route"):
            found.update((m, path) for m in _methods_kw(node, ("GET",)))
        elif func.attr in ("mount", "add_websocket_route", "websocket_route"):
            found.add(("GET", path))
    return found


def routes_in_wheel(wheel: Path) -> set[tuple[str, str]]:
    """Every route vLLM's OpenAI-compatible server can serve, from the wheel's sources."""
    found = set(FASTAPI_DEFAULT_ROUTES)
    with zipfile.ZipFile(wheel) as archive:
        for name in archive.namelist():
            if name.startswith("vllm/entrypoints/") and name.endswith(".py"):
                found |= routes_in_source(archive.read(name).decode("utf-8"))
    return found


def routes_in_package(site_packages: Path) -> set[tuple[str, str]]:
    """The same, from an installed vLLM (the CPU build the tests run, `scripts/engine`)."""
    found = set(FASTAPI_DEFAULT_ROUTES)
    for module in sorted((site_packages / "vllm" / "entrypoints").rglob("*.py")):
        found |= routes_in_source(module.read_text(encoding="utf-8"))
    return found


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--fetch", action="store_true", help="only fetch the wheel")
    parser.add_argument("--version", default=VLLM_ROUTES_VERSION)
    args = parser.parse_args()
    wheel = ensure_wheel(args.version)
    if args.fetch:
        print(wheel)
        return 0
    for method, path in sorted(routes_in_wheel(wheel), key=lambda r: (r[1], r[0])):
        print(f"{method:6} {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
