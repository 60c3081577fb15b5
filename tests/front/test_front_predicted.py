"""Predicted against delivered at the cache front (issue 39), over real sockets.

The picker's signed `x-promptcache-predicted` header (`tenancy.prediction`) is believed only
when it verifies under the salt key; it never reaches vLLM; the prompt, predicted and
delivered (cached) tokens of a predicted request are counted together by scope class."""

from __future__ import annotations

import json
import re
import time

import aiohttp
from aiohttp import web

from harness.front_app import SECRET, MakeFront
from harness.standin import StandinUpstream
from promptcache.contract import PREDICTED_MATCH_HEADER, SCOPE_CLASSES, IsolationMode
from promptcache.embeds.cache import PromptEmbedsCache
from promptcache.front.hits import ScopeClass
from promptcache.front.http_server import create_runner
from promptcache.front.sampling import PredictionSampler
from promptcache.front.settings import FrontSettings
from promptcache.tenancy.prediction import Prediction, prediction_key, sign

CHAT = "/v1/chat/completions"
Standin = tuple[StandinUpstream, str]
KEY = prediction_key(SECRET)


def _chat(**extra: object) -> dict[str, object]:
    return {"model": "m", "messages": [{"role": "user", "content": "hi"}], **extra}


def _signed(
    match: int,
    total: int,
    block: int = 16,
    *,
    key: bytes = KEY,
    seen: int | None = None,
    held: int | None = None,
) -> str:
    return sign(key, Prediction(match, total, block, seen, held), now=int(time.time()))


async def _post(
    http: aiohttp.ClientSession, url: str, body: object, headers: dict[str, str]
) -> str:
    data = json.dumps(body).encode()
    hdrs = {"Content-Type": "application/json", **headers}
    async with http.post(url + CHAT, data=data, headers=hdrs) as resp:
        assert resp.status == 200, await resp.text()
        return await resp.text()


async def _metrics(http: aiohttp.ClientSession, url: str) -> dict[str, float]:
    async with http.get(url + "/metrics") as resp:
        text = await resp.text()
    names = "accounted|predicted|delivered|predictions|estimated|workload|capacity"
    pattern = rf"^(promptcache_front_(?:{names})_\S*_total\S*|promptcache_front_predictions_total\S*) (\S+)$"
    return {m[1]: float(m[2]) for m in re.finditer(pattern, text, re.MULTILINE)}


async def test_signed_prediction_is_counted_with_what_vllm_delivered(
    standin: Standin, make_front: MakeFront, http: aiohttp.ClientSession
) -> None:
    """Keyed and unkeyed requests in PerKey, whole and streamed: each scope class counts its
    own prompt, predicted (matched blocks x block size, at most the prompt) and cached
    tokens; the header never reaches vLLM."""
    upstream, _ = standin
    front = await make_front(isolation_mode=IsolationMode.PER_KEY)
    keyed = {"x-prompt-cache-isolation-key": "tenant-a"}
    upstream.prompt_tokens, upstream.cached_tokens = 100, 32
    await _post(http, front.url, _chat(), {**keyed, PREDICTED_MATCH_HEADER: _signed(3, 6)})
    assert PREDICTED_MATCH_HEADER not in {h.lower() for h in upstream.requests[-1].headers}
    upstream.prompt_tokens, upstream.cached_tokens = 40, 32
    await _post(
        http, front.url, _chat(stream=True), {**keyed, PREDICTED_MATCH_HEADER: _signed(4, 4)}
    )
    upstream.prompt_tokens, upstream.cached_tokens = 50, 0
    await _post(http, front.url, _chat(), {PREDICTED_MATCH_HEADER: _signed(1, 3)})
    got = await _metrics(http, front.url)
    assert got['promptcache_front_accounted_prompt_tokens_total{scope="keyed"}'] == 140
    # 3 of 6 blocks of 100 tokens, then 4 of 4 blocks of 40: shares of what vLLM counted
    assert got['promptcache_front_predicted_tokens_total{scope="keyed"}'] == 50 + 40
    assert got['promptcache_front_delivered_tokens_total{scope="keyed"}'] == 64
    assert got['promptcache_front_accounted_prompt_tokens_total{scope="shared"}'] == 50
    assert got['promptcache_front_predicted_tokens_total{scope="shared"}'] == 17  # 1 of 3
    assert got['promptcache_front_delivered_tokens_total{scope="shared"}'] == 0
    assert got['promptcache_front_predictions_total{outcome="valid"}'] == 3


async def test_a_client_cannot_skew_the_figures(
    standin: Standin, make_front: MakeFront, http: aiohttp.ClientSession
) -> None:
    """Straight to the pod: a header signed with another key is forged, a garbled one
    malformed, a copy of a valid one replayed; none is counted as predicted, none reaches
    vLLM, and the request is served all the same."""
    upstream, _ = standin
    front = await make_front(isolation_mode=IsolationMode.PER_KEY)
    upstream.prompt_tokens, upstream.cached_tokens = 100, 10
    forged = _signed(6, 6, key=prediction_key(b"not-the-salt-key-0123456789"))
    await _post(http, front.url, _chat(), {PREDICTED_MATCH_HEADER: forged})
    await _post(http, front.url, _chat(), {PREDICTED_MATCH_HEADER: "v1.1.2.3"})
    valid = _signed(1, 6)
    await _post(http, front.url, _chat(), {PREDICTED_MATCH_HEADER: valid})
    await _post(http, front.url, _chat(), {PREDICTED_MATCH_HEADER: valid})
    stale = sign(KEY, Prediction(6, 6, 16), now=int(time.time()) - 3600)
    await _post(http, front.url, _chat(), {PREDICTED_MATCH_HEADER: stale})
    await _post(http, front.url, _chat(), {PREDICTED_MATCH_HEADER: ""})  # the picker blanked it
    assert all(
        PREDICTED_MATCH_HEADER not in {h.lower() for h in r.headers} for r in upstream.requests
    )
    got = await _metrics(http, front.url)
    for outcome in ("forged", "malformed", "valid", "replayed", "expired", "absent"):
        assert got[f'promptcache_front_predictions_total{{outcome="{outcome}"}}'] == 1, outcome
    # only the one valid request is in the paired sample
    assert got['promptcache_front_accounted_prompt_tokens_total{scope="shared"}'] == 100
    assert got['promptcache_front_predicted_tokens_total{scope="shared"}'] == 17  # 1 of 6


async def test_without_a_salt_key_nothing_is_believed(
    standin: Standin, make_front: MakeFront, http: aiohttp.ClientSession
) -> None:
    """Mode Shared mounts no salt key here: a prediction cannot be checked, so it is counted
    unverifiable, dropped, and adds nothing to the paired sample."""
    upstream, _ = standin
    front = await make_front(isolation_mode=IsolationMode.SHARED)
    await _post(http, front.url, _chat(), {PREDICTED_MATCH_HEADER: _signed(1, 2)})
    assert PREDICTED_MATCH_HEADER not in {h.lower() for h in upstream.requests[-1].headers}
    got = await _metrics(http, front.url)
    assert got['promptcache_front_predictions_total{outcome="unverifiable"}'] == 1
    assert not any(k.startswith("promptcache_front_accounted") and v for k, v in got.items())


async def test_workload_and_capacity_are_counted_with_their_own_denominator(
    standin: Standin, make_front: MakeFront, http: aiohttp.ClientSession
) -> None:
    """The picker's workload and capacity estimates (blocks a perfect cache, and a cache of
    the pool's size, would have held) are counted, in tokens, over the prompts that carried
    them; a prediction without them adds to the predicted sample only."""
    upstream, _ = standin
    front = await make_front(isolation_mode=IsolationMode.PER_KEY)
    keyed = {"x-prompt-cache-isolation-key": "tenant-a"}
    upstream.prompt_tokens, upstream.cached_tokens = 100, 32
    headers = {**keyed, PREDICTED_MATCH_HEADER: _signed(3, 6, seen=6, held=4)}
    await _post(http, front.url, _chat(), headers)
    await _post(http, front.url, _chat(), {**keyed, PREDICTED_MATCH_HEADER: _signed(3, 6)})
    got = await _metrics(http, front.url)
    assert got['promptcache_front_accounted_prompt_tokens_total{scope="keyed"}'] == 200
    assert got['promptcache_front_estimated_prompt_tokens_total{scope="keyed"}'] == 100
    assert got['promptcache_front_workload_tokens_total{scope="keyed"}'] == 100  # 6 of 6
    assert got['promptcache_front_capacity_tokens_total{scope="keyed"}'] == 67  # 4 of 6


def test_the_scope_classes_are_the_contracts() -> None:
    assert tuple(ScopeClass) == SCOPE_CLASSES


async def test_in_mode_shared_a_mounted_key_checks_predictions(
    standin: Standin, http: aiohttp.ClientSession
) -> None:
    """Mode Shared salts nothing, but with promptcache's picker the renderer mounts the salt
    key in the pods all the same: the front checks the picker's predictions with it."""
    upstream, url = standin
    settings = FrontSettings(upstream=url, isolation_mode=IsolationMode.SHARED)
    runner = create_runner(settings, secret=SECRET, cache=PromptEmbedsCache(0))
    await runner.setup()
    try:
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        front = f"http://127.0.0.1:{runner.addresses[0][1]}"
        upstream.prompt_tokens, upstream.cached_tokens = 100, 48
        await _post(http, front, _chat(), {PREDICTED_MATCH_HEADER: _signed(3, 6, seen=6, held=6)})
        assert "cache_salt" not in upstream.requests[-1].json()  # Shared: nothing salted
        got = await _metrics(http, front)
        assert got['promptcache_front_predicted_tokens_total{scope="shared"}'] == 50  # 3 of 6
        assert got['promptcache_front_delivered_tokens_total{scope="shared"}'] == 48
        assert got['promptcache_front_workload_tokens_total{scope="shared"}'] == 100
    finally:
        await runner.cleanup()


class _EveryOther(PredictionSampler):
    """Draws the first, third, ... request at weight 2 (the draw itself is the sampler's own
    test's, tests/front/test_front_sampling.py; this one holds what the front does with it)."""

    __slots__ = ("drawn",)

    def __init__(self) -> None:
        super().__init__()
        self.drawn = 0

    def weight(self) -> float:
        self.drawn += 1
        return 2.0 if self.drawn % 2 else 0.0


async def test_a_sampled_front_counts_weighted_and_believes_nothing_unchecked(
    standin: Standin, make_front: MakeFront, http: aiohttp.ClientSession
) -> None:
    """Over real sockets, with a sampler that draws every other request at weight 2: the
    ladder's counters are the weighted sums of the drawn requests (the first and the third),
    the verdicts are weighted, and a forged header on an undrawn request is believed by no
    counter."""
    upstream, _ = standin
    front = await make_front(isolation_mode=IsolationMode.PER_KEY)
    front.state.sampler = _EveryOther()
    keyed = {"x-prompt-cache-isolation-key": "tenant-a"}
    upstream.prompt_tokens, upstream.cached_tokens = 100, 32
    for header in (_signed(3, 6), "forged", _signed(3, 6), _signed(5, 6)):
        await _post(http, front.url, _chat(), {**keyed, PREDICTED_MATCH_HEADER: header})
    got = await _metrics(http, front.url)
    assert got['promptcache_front_accounted_prompt_tokens_total{scope="keyed"}'] == 2 * 100 * 2
    half = 50  # 3 of 6 blocks: half the prompt
    assert got['promptcache_front_predicted_tokens_total{scope="keyed"}'] == 2 * half * 2
    assert got['promptcache_front_delivered_tokens_total{scope="keyed"}'] == 2 * 32 * 2
    assert got['promptcache_front_predictions_total{outcome="valid"}'] == 4.0
    assert got.get('promptcache_front_predictions_total{outcome="forged"}', 0.0) == 0.0
