"""Fixtures: one real engine per session behind the rendered front, more fronts on demand.

The engine takes tens of seconds to start and about 4 GB, so one rendered pod (PerKey
isolation, prompt embeds on, block size 32) serves every test that only needs *an*
engine; other isolation modes are front-only pods of their own rendered resources in
front of that engine. Tests that kill or restart an engine start their own.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from harness.engine.pods import FrontFor, SaltSecrets, engine_resource, front_only_pod, process_pod
from harness.pod import ProcessPod
from harness.vllm import engine_unavailable, tiny_model

ENGINE_TEST_TIMEOUT_S = 1500
"""pytest-timeout's limit for a real-engine test (the default is 600 s), set-up and teardown
included: the first test of a module pays for the session's engine (a slot wait bounded at
600 s by scripts/test, then tens of seconds to start) and the module's own pods; the longest
call measured on a busy machine was 660 s (adding and removing an adapter). A test's own
`@pytest.mark.timeout` wins over this one."""


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    for item in items:
        if Path(str(item.fspath)).is_relative_to(here):
            item.add_marker(pytest.mark.engine)
            item.add_marker(pytest.mark.timeout(ENGINE_TEST_TIMEOUT_S))


@pytest.fixture(scope="session")
def engine_model() -> Path:
    why = engine_unavailable()
    if why is not None:  # a machine like CI's always has it: fail, never skip
        pytest.fail(f"the real engine is not installed: {why}")
    return tiny_model()


@pytest.fixture(scope="session")
def salt_secrets() -> SaltSecrets:
    return SaltSecrets()


@pytest.fixture(scope="session")
def engine_pod(
    engine_model: Path, salt_secrets: SaltSecrets, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ProcessPod]:
    """The rendered PerKey pod: cache front + real vLLM, Ready by its own probes."""
    resource = engine_resource(engine_model, name="perkey")
    pod = process_pod(resource, tmp_path_factory.mktemp("engine-pod"), secrets_=salt_secrets)
    pod.outlives_module = True
    with pod:
        yield pod


@pytest.fixture(scope="session")
def engine_url(engine_pod: ProcessPod) -> str:
    """The engine itself (inside the pod, behind the front)."""
    return f"http://{engine_pod.ip}:8001"


@pytest.fixture(scope="session")
def front_for(
    engine_model: Path,
    engine_pod: ProcessPod,
    engine_url: str,
    salt_secrets: SaltSecrets,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[FrontFor]:
    """`front_for(mode="Required", **spec)` -> the URL of a rendered front for that
    resource, in front of the session's engine (one front per distinct spec)."""
    started: dict[str, ProcessPod] = {}

    def make(mode: str = "PerKey", **spec: Any) -> str:
        if mode == "PerKey" and not spec:
            return engine_pod.url()
        key = repr((mode, sorted(spec.items())))
        if key not in started:
            name = f"front-{mode.lower()}-{len(started)}"
            resource = engine_resource(engine_model, name=name, isolation={"mode": mode}, **spec)
            pod = front_only_pod(resource, engine_url, tmp_path_factory.mktemp(name), salt_secrets)
            pod.outlives_module = True
            started[key] = pod.start().wait_ready(timeout_s=120)
        return started[key].url()

    yield make
    for pod in started.values():
        pod.stop()


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=300)) as session:
        yield session


_prompts = iter(range(1, 1 << 30))


@pytest.fixture
def fresh_prompt() -> Callable[[], str]:
    """A prompt no earlier request of this session sent (so nothing of it is cached)."""
    from harness.engine.client import long_text  # noqa: PLC0415

    return lambda: long_text(next(_prompts))
