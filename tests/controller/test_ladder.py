"""The hit-ratio ladder in the status (issue 39): rungs from the fronts' counters, the
largest loss named with what to change, and CacheDelivering."""

from __future__ import annotations

import copy

import pytest

from harness.resources import BASE
from promptcache.api import parse_resource
from promptcache.api.status import ConditionType, Reason
from promptcache.contract import LadderCounter
from promptcache.controller.ladder import MIN_PROMPT_TOKENS, Loss, delivering, rungs, status
from promptcache.controller.observation import Observation
from promptcache.controller.salt import generated_salt_secret
from promptcache.controller.scrape import LADDER, parse_metrics
from promptcache.controller.status import compute_status
from promptcache.controller.window import HitWindow
from promptcache.embeds.cache import PromptEmbedsCache
from promptcache.front.hits import ScopeClass, Tally
from promptcache.front.metrics import FrontMetrics
from promptcache.render import names_of, render, resolved
from promptcache.tenancy.prediction import Prediction


def increases(
    *, prompt: float, workload: float, capacity: float, predicted: float, delivered: float
) -> list[float]:
    by = {
        LadderCounter.ACCOUNTED: prompt,
        LadderCounter.ESTIMATED: prompt,
        LadderCounter.WORKLOAD: workload * prompt,
        LadderCounter.CAPACITY: capacity * prompt,
        LadderCounter.PREDICTED: predicted * prompt,
        LadderCounter.DELIVERED: delivered * prompt,
    }
    return [by[c] for c in LADDER]


@pytest.mark.parametrize(
    ("shares", "loss", "advice"),
    [
        ((0.8, 0.78, 0.76, 0.74), Loss.NONE, "no step loses more than"),
        ((0.8, 0.3, 0.28, 0.27), Loss.CAPACITY, "add replicas or GPU memory"),
        ((0.05, 0.05, 0.05, 0.04), Loss.WORKLOAD, "share little prefix"),
        ((0.3, 0.1, 0.1, 0.1), Loss.CAPACITY, "add replicas"),  # 20 points to win back
        ((0.8, 0.8, 0.3, 0.3), Loss.ROUTING, "sessionAffinity"),
        ((0.8, 0.8, 0.78, 0.2), Loss.DELIVERY, "autoTune"),
    ],
)
def test_the_largest_loss_is_named_with_what_to_change(
    shares: tuple[float, float, float, float], loss: Loss, advice: str
) -> None:
    workload, capacity, predicted, delivered = shares
    r = rungs(
        increases(
            prompt=10_000,
            workload=workload,
            capacity=capacity,
            predicted=predicted,
            delivered=delivered,
        ),
        300,
    )
    assert r is not None
    assert r.largest()[0] is loss
    st = status(r)
    assert st.largest_loss == loss.value
    assert advice in st.message
    assert (st.workload, st.capacity, st.routing, st.delivered) == shares
    assert st.message.startswith("Of the prompt tokens of the last 5 min")


@pytest.mark.parametrize(
    ("span_s", "said"), [(0.2, "1 s"), (20, "20 s"), (119, "119 s"), (120, "2 min"), (330, "6 min")]
)
def test_the_sentence_names_the_span_the_window_covered(span_s: float, said: str) -> None:
    r = rungs(increases(prompt=10_000, workload=1, capacity=1, predicted=1, delivered=1), span_s)
    assert r is not None
    assert status(r).message.startswith(f"Of the prompt tokens of the last {said},")


def test_too_few_tokens_give_no_verdict() -> None:
    low = increases(prompt=MIN_PROMPT_TOKENS - 1, workload=1, capacity=1, predicted=1, delivered=0)
    assert rungs(low, 300) is None


def test_without_estimates_routing_and_delivery_still_judge() -> None:
    values = increases(prompt=5000, workload=0, capacity=0, predicted=0.9, delivered=0.2)
    values[LADDER.index(LadderCounter.ESTIMATED)] = 0
    r = rungs(values, 120)
    assert r is not None
    assert (r.workload, r.capacity) == (None, None)
    assert r.largest()[0] is Loss.DELIVERY
    assert "a perfect cache could have served ?" in status(r).message


def test_cache_delivering_turns_false_when_delivered_stays_far_below_predicted() -> None:
    far = rungs(increases(prompt=5000, workload=1, capacity=1, predicted=0.8, delivered=0.2), 300)
    near = rungs(increases(prompt=5000, workload=1, capacity=1, predicted=0.8, delivered=0.7), 300)
    assert far is not None
    assert near is not None
    bad, good = delivering(far), delivering(near)
    assert (bad.status, bad.reason) == ("False", Reason.DELIVERED_BELOW_PREDICTED)
    assert (good.status, good.reason) == ("True", Reason.AS_PREDICTED)
    obs = Observation(generation=1, cache=status(far), cache_delivering=bad)
    written = compute_status(obs, None, now="2026-12-06T10:00:00Z")
    assert written["cache"]["largestLoss"] == "Delivery"
    (cond,) = [c for c in written["conditions"] if c["type"] == ConditionType.CACHE_DELIVERING]
    assert cond["status"] == "False"
    # no ladder any more (no predicted traffic): the condition goes
    gone = compute_status(Observation(generation=1), written, now="2026-12-06T10:05:00Z")
    assert ConditionType.CACHE_DELIVERING not in {c["type"] for c in gone["conditions"]}
    assert "cache" not in gone


def test_the_operator_reads_what_the_front_writes() -> None:
    """The front's own exposition, parsed by the operator's scrape, windowed per pod."""
    front = FrontMetrics(PromptEmbedsCache(0).stats)
    window = HitWindow()
    window.record(0, {"pod": parse_metrics(front.render().decode()).ladder})
    p = Prediction(6, 8, 16, 8, 7)
    for scope in (ScopeClass.KEYED, ScopeClass.SHARED):
        for _ in range(10):
            front.observe_usage(128, 64, Tally(scope, p))
    window.record(60, {"pod": parse_metrics(front.render().decode()).ladder})
    r = rungs(*window.increases(len(LADDER)))
    assert r is not None
    assert r.prompt_tokens == 2560
    assert (r.workload, r.capacity, r.routing, r.delivered) == (1.0, 0.875, 0.75, 0.5)
    assert r.largest()[0] is Loss.DELIVERY


@pytest.mark.parametrize(
    ("picker", "mode", "generated"),
    [
        ("promptcache", "Shared", True),  # nothing salted, but the picker signs predictions
        ("promptcache", "PerKey", True),
        ("gie-v1.5", "Shared", False),
        ("gie-v1.5", "PerKey", True),
    ],
)
def test_the_operator_generates_the_salt_secret_where_the_pods_mount_it(
    picker: str, mode: str, generated: bool
) -> None:
    doc = copy.deepcopy(BASE)
    doc["spec"].update(gateway={"picker": picker}, isolation={"mode": mode})
    pcd = resolved(parse_resource(doc))
    names = names_of(pcd)
    secret = generated_salt_secret(pcd, names)
    assert (secret is not None) is generated
    volumes = [
        v["secret"]["secretName"]
        for m in render(pcd)
        if m["kind"] == "Deployment"
        for v in m["spec"]["template"]["spec"].get("volumes", [])
        if "secret" in v
    ]
    assert set(volumes) == ({secret[0]} if secret else set())
