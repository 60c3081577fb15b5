"""The picker's autoTune on real engines: the block size it hashes is the one vLLM reports.

Two rendered model-server pods (cache front + real `vllm serve`, block size 32) run as
processes on the IPs kwok gave their pod objects, behind the picker as rendered by default
(promptcache's build of GIE v1.5.0, which derives the tenant salt and signs the account
itself: no policy step in front of it). The picker scrapes each front's `/metrics`, which
carries the engine's own `vllm:cache_config_info{block_size="32",num_gpu_blocks=...}`.

The picker's config is the rendered one with `blockSizeTokens` raised to 256, so the two
possible sources disagree: a prompt sharing 100 tokens with an earlier one shares three
whole 32-token blocks but no 256-token block. Under autoTune the later prompt must follow
the pod that took the first, every time; with autoTune off (the same config otherwise, a
fresh picker) the shared prefix is invisible and the idle pods tie, so the picks scatter.
Twelve prompt families each: a chance pass of the first check, or a chance fail of the
second, is 2^-12.

The same pool isolates by account (`isolation.identity`, #27): through the real picker, two
accounts sending one isolation key get two scopes by the engine's own cached-token counts,
and neither a forged identity header at the pod nor a copied attestation (through the
gateway or replayed at the pod) reaches an account's scope. The autoTune checks send no
account, so it changes nothing for them.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from harness.engine.cluster_pods import start_pool_pods
from harness.engine.pods import BLOCK_SIZE, engine_resource
from harness.epp.binary import find_epp_binary, missing_reason
from harness.epp.extproc import chat_body
from harness.epp.pool import PoolOnCluster
from harness.epp.rendered import Rendered, render_resource
from harness.epp.scenarios import index_grows, unique_text
from harness.extproc_gateway import envoy_applies
from harness.pod import ProcessPod
from harness.pytest_cluster import Cluster
from promptcache.contract import (
    DEFAULT_ISOLATION_HEADER,
    IDENTITY_ATTESTATION_HEADER,
    PickerTarget,
)
from promptcache.render.epp_config import PREFIX_PRODUCER

pytestmark = pytest.mark.cluster

FAMILIES = 12
CONFIGURED_BLOCK = 256
"""Tokens per block in the picker's own config: far above what the engines report."""
SHARED_BYTES = 400
"""About 100 tokens at the picker's 4 bytes a token: 3 blocks of 32, no block of 256."""
KV_CACHE_BYTES = 8 << 20
"""8 MiB each: 256 blocks of 32 for the tiny model; the resource caps maxModelLen to fit."""
ACCOUNT_HEADER = "x-account-id"
"""What the gateway's authentication sets (the test plays the gateway)."""
KEY = DEFAULT_ISOLATION_HEADER
PROMPT_BYTES = 800
"""Several 32-token blocks, few enough that a pod's 256 blocks hold every prompt here."""


@pytest.fixture(scope="module")
def real_pool(
    cluster: Cluster, engine_model: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[PoolOnCluster, list[ProcessPod]]]:
    # `e2e/cluster build` builds it: never skip
    if find_epp_binary(PickerTarget.PROMPTCACHE) is None:
        pytest.fail(missing_reason(PickerTarget.PROMPTCACHE))
    workdir = tmp_path_factory.mktemp("picker-real")
    resource = engine_resource(
        engine_model,
        name="autotune",
        engine={"maxModelLen": 4096},
        prefixCache={"autoTune": True},
        isolation={"identity": {"header": ACCOUNT_HEADER, "bearerToken": True}},
    )
    resource["spec"]["model"]["replicas"] = 2
    resource["metadata"]["namespace"] = cluster.create_namespace("picker-real")
    pool = PoolOnCluster(cluster, Rendered(render_resource(resource)), workdir / "pool")
    try:
        pool.apply()
        pods = start_pool_pods(pool, workdir, KV_CACHE_BYTES)
        try:
            yield pool, pods
        finally:
            for p in pods:
                p.stop()
    finally:
        pool.close()


def _config(pool: PoolOnCluster, auto_tune: bool) -> str:
    text = pool.rendered.epp_config_text_with_salt_key(pool.salt_key_file)
    doc: dict[str, Any] = yaml.safe_load(text)
    (producer,) = [p for p in doc["plugins"] if p["type"] == PREFIX_PRODUCER]
    producer["parameters"].update(autoTune=auto_tune, blockSizeTokens=CONFIGURED_BLOCK)
    return yaml.safe_dump(doc, sort_keys=False)


def _followers(pool: PoolOnCluster, pods: list[ProcessPod], auto_tune: bool) -> int:
    """How many of the prompt families' second prompts went where their first one did."""
    pool.start_epp(config_text=_config(pool, auto_tune), wait_scraped=False)
    assert pool.epp is not None
    pool.epp.wait_scraped({p.name: 0.0 for p in pods})
    followed = 0
    with pool.client() as client:
        for _ in range(FAMILIES):
            shared = unique_text(SHARED_BYTES)
            with index_grows(pool.epp):  # the second pick must see the first's blocks
                first = client.pick(chat_body(shared + "A" * 1200, model="tiny")).endpoint
            assert first is not None
            second = client.pick(chat_body(shared + "B" * 1200, model="tiny")).endpoint
            followed += second == first
    pool.stop_picker()
    return followed


def test_engines_report_the_rendered_block_size(
    real_pool: tuple[PoolOnCluster, list[ProcessPod]],
) -> None:
    """What the picker reads: the real engine's own series, through the front's /metrics."""
    import urllib.request  # noqa: PLC0415

    _, pods = real_pool
    for p in pods:
        with urllib.request.urlopen(f"{p.url()}/metrics", timeout=30) as r:
            text = r.read().decode()
        (line,) = [ln for ln in text.splitlines() if ln.startswith("vllm:cache_config_info{")]
        assert f'block_size="{BLOCK_SIZE}"' in line, line


def test_autotune_hashes_at_the_engines_block_size(
    real_pool: tuple[PoolOnCluster, list[ProcessPod]],
) -> None:
    pool, pods = real_pool
    assert _followers(pool, pods, auto_tune=True) == FAMILIES, (
        "under autoTune a prompt sharing three 32-token blocks did not follow: the picker "
        "did not take the block size from the engines' vllm:cache_config_info"
    )


def test_without_autotune_the_configured_block_size_hides_the_prefix(
    real_pool: tuple[PoolOnCluster, list[ProcessPod]],
) -> None:
    """The control: the same check cannot pass by itself."""
    pool, pods = real_pool
    assert _followers(pool, pods, auto_tune=False) < FAMILIES


def _serve(pod: ProcessPod, body: bytes, headers: list[tuple[str, str]]) -> int:
    """POST to one pod's front what the gateway would send it; the engine's cached tokens."""
    skip = {"host", "content-length", "transfer-encoding"}
    req = urllib.request.Request(
        f"{pod.url()}/v1/chat/completions",
        data=body,
        headers={k: v for k, v in headers if not k.startswith(":") and k not in skip},
        method="POST",
    )
    try:
        with urllib.request.urlopen(req, timeout=300) as resp:
            answer = json.loads(resp.read())
    except urllib.error.HTTPError as error:
        raise AssertionError(f"{error.code}: {error.read()[:300]!r}") from None
    return int(answer["usage"]["prompt_tokens_details"]["cached_tokens"] or 0)


def test_accounts_are_isolated_by_the_engines_own_counts(
    real_pool: tuple[PoolOnCluster, list[ProcessPod]],
) -> None:
    pool, pods = real_pool
    by_endpoint = {f"{p.ip}:{p.ports['http']}": p for p in pods}
    pool.start_epp(wait_scraped=False)
    assert pool.epp is not None
    pool.epp.wait_scraped({p.name: 0.0 for p in pods})
    alice = {ACCOUNT_HEADER: "alice", KEY: "team"}
    try:
        with pool.client() as gateway:

            def through(
                text: str, headers: dict[str, str]
            ) -> tuple[ProcessPod, bytes, list[tuple[str, str]]]:
                pick = gateway.pick(chat_body(text, model="tiny"), headers=headers)
                assert pick.endpoint in by_endpoint, (pick.endpoint, pick.immediate_body)
                sent = envoy_applies(pick.sent_headers, pick.responses)
                return by_endpoint[pick.endpoint], pick.body, sent

            def alices(text: str) -> tuple[ProcessPod, bytes, list[tuple[str, str]]]:
                """Alice sends `text` twice; her repeat hits, on the pod the picker keeps."""
                with index_grows(pool.epp):  # her repeat must see her first's blocks
                    home, body, sent = through(text, alice)
                assert _serve(home, body, sent) == 0
                again, body2, sent2 = through(text, alice)
                assert again is home, "alice's repeat left the pod holding her prefix"
                assert _serve(home, body2, sent2) > 0, "alice's repeat must hit her own scope"
                return home, body2, sent2

            # another account with the same key, on alice's very engine: nothing
            text = unique_text(PROMPT_BYTES)
            home, _, _ = alices(text)
            _, bob_body, bob_sent = through(text, {ACCOUNT_HEADER: "bob", KEY: "team"})
            assert _serve(home, bob_body, bob_sent) == 0, "bob reached alice's scope"
            _, anon_body, anon_sent = through(text, {KEY: "team"})
            assert _serve(home, anon_body, anon_sent) == 0, "the key alone reached alice's"
            # a forged identity header sent straight to the pod: nothing of alice's
            text = unique_text(PROMPT_BYTES)
            home, body, sent = alices(text)
            forged = [(k, v) for k, v in sent if k != IDENTITY_ATTESTATION_HEADER]
            assert _serve(home, body, forged) == 0, "a forged identity header reached alice"
            # her signed request replayed at the pod: nothing of alice's
            text = unique_text(PROMPT_BYTES)
            home, body, sent = alices(text)
            assert _serve(home, body, sent) == 0, "a replayed attestation reached alice"
            # her attestation copied into a request through the gateway: removed there
            text = unique_text(PROMPT_BYTES)
            home, body, sent = alices(text)
            stolen = next(v for k, v in sent if k == IDENTITY_ATTESTATION_HEADER)
            _, s_body, s_sent = through(text, {IDENTITY_ATTESTATION_HEADER: stolen, KEY: "team"})
            # The picker blanks a client's copy (GIE's ext_proc answer can only set
            # headers): no value of it reaches the pod.
            assert not [v for k, v in s_sent if k == IDENTITY_ATTESTATION_HEADER and v]
            assert _serve(home, s_body, s_sent) == 0, "a smuggled attestation reached alice"
    finally:
        pool.stop_picker()
