"""`vllm serve` flags and LoRA facts, read out of vLLM's own source (its wheel) by `ast`.

The renderer writes `vllm serve` flags by name (`contract.VllmFlag`); vLLM is not installed
here (its dependencies are heavy), so `tests/render/test_render_lora.py` reads the flag
names and the allowed LoRA ranks from the wheel `tools/vllm_routes.py` caches:

- every `add_argument("--flag", ...)` in the package (the engine's arguments);
- every field of the frontend argument classes (`*FrontendArgs` in `entrypoints/`), which
  vLLM registers as `--field-name`;
- `MaxLoRARanks` in `vllm/config/lora.py`, the values `--max-lora-rank` accepts;
- the fields of `LoRAModulePath`, what a JSON `--lora-modules` item may carry.
"""

from __future__ import annotations

import ast
import zipfile
from pathlib import Path


def _sources(wheel: Path, prefix: str = "vllm/") -> dict[str, str]:
    with zipfile.ZipFile(wheel) as archive:
        return {
            name: archive.read(name).decode("utf-8")
            for name in archive.namelist()
            if name.startswith(prefix) and name.endswith(".py")
        }


def _dataclass_fields(node: ast.ClassDef) -> list[str]:
    return [
        stmt.target.id
        for stmt in node.body
        if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name)
    ]


def flags_in_wheel(wheel: Path) -> set[str]:
    """Every `--flag` `vllm serve` registers, as far as the sources show it."""
    flags: set[str] = set()
    for name, source in _sources(wheel).items():
        # Only a file that says one of these names can hold what is matched below; parsing
        # the few that do, not the wheel's thousands of modules, is what keeps this fast.
        if "add_argument" not in source and "FrontendArgs" not in source:
            continue
        tree = ast.parse(source)
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr == "add_argument"
            ):
                flags.update(
                    a.value
                    for a in node.args
                    if isinstance(a, ast.Constant)
                    and isinstance(a.value, str)
                    and a.value.startswith("--")
                )
            if (
                name.startswith("vllm/entrypoints/")
                and isinstance(node, ast.ClassDef)
                and node.name.endswith("FrontendArgs")
            ):
                flags.update("--" + f.replace("_", "-") for f in _dataclass_fields(node))
    return flags


def _class(wheel: Path, path: str, cls: str) -> ast.ClassDef:
    tree = ast.parse(_sources(wheel, path)[path])
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef) and node.name == cls:
            return node
    raise LookupError(f"{cls} not found in {path}")


def lora_ranks_in_wheel(wheel: Path) -> tuple[int, ...]:
    """`MaxLoRARanks = Literal[...]` of `vllm/config/lora.py`."""
    path = "vllm/config/lora.py"
    for node in ast.walk(ast.parse(_sources(wheel, path)[path])):
        if (
            isinstance(node, ast.Assign)
            and any(isinstance(t, ast.Name) and t.id == "MaxLoRARanks" for t in node.targets)
            and isinstance(node.value, ast.Subscript)
        ):
            elts = node.value.slice.elts if isinstance(node.value.slice, ast.Tuple) else []
            return tuple(
                e.value for e in elts if isinstance(e, ast.Constant) and isinstance(e.value, int)
            )
    raise LookupError("MaxLoRARanks not found")


def lora_module_fields_in_wheel(wheel: Path) -> list[str]:
    """Fields of `LoRAModulePath` (`vllm/entrypoints/openai/models/protocol.py`)."""
    node = _class(wheel, "vllm/entrypoints/openai/models/protocol.py", "LoRAModulePath")
    return _dataclass_fields(node)


def lora_modules_parser_source(wheel: Path) -> str:
    """The source of `LoRAParserAction.__call__`, which splits `name=path` from JSON."""
    path = "vllm/entrypoints/common/cli_args.py"
    node = _class(wheel, path, "LoRAParserAction")
    return ast.unparse(node)
