"""Reading PromptCacheDeployments from files or stdin, with errors a user can act on.

Every failure becomes an `InvalidResourceError` whose problems name the file,
the document and the field, so the CLI can print them and exit 2 without a
traceback.
"""

from __future__ import annotations

import sys
from pathlib import Path

import yaml

from promptcache.api import InvalidResourceError, Problem, PromptCacheDeployment, parse_resource


def read_text(source: str) -> str:
    """`-` reads stdin; anything else is a path."""
    if source == "-":
        return sys.stdin.read()
    try:
        return Path(source).read_text(encoding="utf-8")
    except OSError as error:
        raise InvalidResourceError(
            [Problem("", f"cannot read {source}: {error.strerror}")]
        ) from None
    except UnicodeDecodeError:
        raise InvalidResourceError([Problem("", f"cannot read {source}: not UTF-8 text")]) from None


def load_resources(text: str, *, source: str = "<stdin>") -> list[PromptCacheDeployment]:
    """Parse every document; collect the problems of all of them before failing."""
    try:
        documents = [d for d in yaml.safe_load_all(text) if d is not None]
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        where = f"{source}:{mark.line + 1}:{mark.column + 1}" if mark else source
        problem = getattr(error, "problem", None) or str(error)
        raise InvalidResourceError(
            [Problem("", f"{where}: YAML syntax error: {problem}")]
        ) from None
    if not documents:
        raise InvalidResourceError([Problem("", f"{source}: no resource found")])
    resources: list[PromptCacheDeployment] = []
    problems: list[Problem] = []
    for index, document in enumerate(documents):
        try:
            resources.append(parse_resource(document))
        except InvalidResourceError as error:
            prefix = f"{source} document {index + 1}: " if len(documents) > 1 else ""
            problems += [
                Problem(p.path, prefix + p.message)
                if not p.path
                else Problem(prefix + p.path, p.message)
                for p in error.problems
            ]
    if problems:
        raise InvalidResourceError(problems)
    return resources
