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
from dataclasses import dataclass, field
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


def _parse(source: str) -> ast.Module:
    """`ast.parse`, once more when CPython 3.11 raises its false "AST constructor recursion
    depth mismatch" (python/cpython#106905: the AST builder's depth counter is shared by
    threads, and a parse on another thread of the test process can leave it off). The
    source is the same, so a second parse gives the true result or the true error."""
    try:
        return ast.parse(source)
    except SystemError as error:
        if "recursion depth mismatch" not in str(error):
            raise
        return ast.parse(source)


def routes_in_source(source: str) -> set[tuple[str, str]]:
    """(METHOD, path template) of every route one module declares."""
    found: set[tuple[str, str]] = set()
    for node in ast.walk(_parse(source)):
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


# --------------------------------------------------------------------------- request models

CHAT_MESSAGE_TYPE = "ChatCompletionMessageParam"
"""The chat message type whose content parts and `reasoning` may carry prompt embeds."""
INVOCATION_TYPE_FACTORIES = ("get_generate_invocation_types", "get_pooling_invocation_types")
"""The functions whose `(RequestModel, handler)` lists `/invocations` tries, in order."""


def _names(annotation: ast.expr | None) -> set[str]:
    """The plain class names an annotation mentions (`A | B`, `Annotated[A, ...]`, ...)."""
    if annotation is None:
        return set()
    return {n.id for n in ast.walk(annotation) if isinstance(n, ast.Name)} | {
        n.attr for n in ast.walk(annotation) if isinstance(n, ast.Attribute)
    }


_SEQUENCES = frozenset({"list", "Sequence", "Iterable", "tuple"})


def _list_depth(annotation: ast.expr, target: str) -> int:
    """How many sequence types (`list[...]`, `Sequence[...]`) wrap `target` in
    `annotation` (0: it does not hold `target` at all)."""
    best = 0

    def walk(node: ast.expr, depth: int) -> None:
        nonlocal best
        if isinstance(node, ast.Name) and node.id == target:
            best = max(best, depth or 1)
        elif isinstance(node, ast.Subscript):
            outer = node.value.id if isinstance(node.value, ast.Name) else None
            walk(node.slice, depth + (outer in _SEQUENCES))
        elif isinstance(node, ast.Tuple):
            for element in node.elts:
                walk(element, depth)
        elif isinstance(node, ast.BinOp):
            walk(node.left, depth)
            walk(node.right, depth)

    walk(annotation, 0)
    return best


@dataclass
class RequestModels:
    """vLLM's request models and which routes take them, read from its sources by `ast`."""

    fields: dict[str, dict[str, ast.expr]] = field(default_factory=dict)
    """Class name -> its own annotated fields."""
    bases: dict[str, list[str]] = field(default_factory=dict)
    aliases: dict[str, set[str]] = field(default_factory=dict)
    """Module-level type aliases (`EmbeddingRequest = A | B`) -> the names they join."""
    routes: dict[tuple[str, str], set[str]] = field(default_factory=dict)
    """(METHOD, path) -> the classes its endpoint's request parameter is annotated with."""

    def classes(self, names: set[str], seen: frozenset[str] = frozenset()) -> set[str]:
        """`names` with every type alias among them replaced by the classes it joins."""
        out = set()
        for name in names - seen:
            if name in self.aliases and name not in self.fields:
                out |= self.classes(self.aliases[name], seen | {name})
            elif name in self.fields:
                out.add(name)
        return out

    def route_channels(self, method: str, path: str) -> set[str]:
        """Where a request to this route can carry a prompt-embeds payload."""
        models = self.classes(self.routes.get((method, path), set()))
        return set().union(*(self.payload_channels(m) for m in models)) if models else set()

    def all_fields(self, name: str, seen: frozenset[str] = frozenset()) -> dict[str, ast.expr]:
        """The class's fields with those it inherits (by simple name, within vLLM)."""
        out: dict[str, ast.expr] = {}
        for base in self.bases.get(name, []):
            if base not in seen:
                out.update(self.all_fields(base, seen | {name}))
        out.update(self.fields.get(name, {}))
        return out

    def payload_channels(self, name: str) -> set[str]:
        """Where a request of this class can carry a prompt-embeds payload: `prompt_embeds`
        (the completions field), or `FIELD:DEPTH` for a field holding chat messages
        (`ChatCompletionMessageParam`, whose content parts and `reasoning` take
        `prompt_embeds` parts): depth 1 is one conversation, 2 a list of them."""
        found = set()
        for field_name, annotation in self.all_fields(name).items():
            if field_name == "prompt_embeds":
                found.add("prompt_embeds")
            depth = _list_depth(annotation, CHAT_MESSAGE_TYPE)
            if depth:
                found.add(f"{field_name}:{depth}")
        return found


def _endpoint_models(node: ast.FunctionDef | ast.AsyncFunctionDef) -> set[str]:
    """The classes an endpoint's first parameter (the parsed request body) is typed with."""
    args = node.args.posonlyargs + node.args.args
    if not args or args[0].arg in ("raw_request", "self"):
        return set()
    return _names(args[0].annotation) - {"Request", "None"}


def _invocation_models(source: str) -> list[str]:
    models: list[str] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.FunctionDef) and node.name in INVOCATION_TYPE_FACTORIES:
            for inner in ast.walk(node):
                if isinstance(inner, ast.Tuple) and inner.elts:
                    first = inner.elts[0]
                    if isinstance(first, ast.Name) and first.id[:1].isupper():
                        models.append(first.id)
    return models


def request_models_in_wheel(wheel: Path) -> RequestModels:
    """Every request model class of vLLM's server, and the routes that take each."""
    found = RequestModels()
    with zipfile.ZipFile(wheel) as archive:
        sources = {
            name: archive.read(name).decode("utf-8")
            for name in archive.namelist()
            if name.endswith(".py") and name.startswith(("vllm/entrypoints/", "vllm/renderers/"))
        }
    for source in sources.values():
        tree = ast.parse(source)
        for stmt in tree.body:
            target = (
                stmt.targets[0] if isinstance(stmt, ast.Assign) else getattr(stmt, "target", None)
            )
            value = getattr(stmt, "value", None)
            if isinstance(target, ast.Name) and value is not None and target.id[:1].isupper():
                names = {n for n in _names(value) if n[:1].isupper()}
                if names:
                    found.aliases.setdefault(target.id, set()).update(names)
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef):
                found.bases[node.name] = [b for base in node.bases for b in _names(base)]
                found.fields[node.name] = {
                    stmt.target.id: stmt.annotation
                    for stmt in node.body
                    if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name)
                }
            elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                for decorator in node.decorator_list:
                    if isinstance(decorator, ast.Call):
                        for method, path in routes_in_source(ast.unparse(decorator)):
                            found.routes.setdefault((method, path), set()).update(
                                _endpoint_models(node)
                            )
        invocations = _invocation_models(source)
        if invocations:
            found.routes.setdefault(("POST", "/invocations"), set()).update(invocations)
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
