"""A stand-in for one model-server pod: vLLM's Prometheus text and an OpenAI upstream.

The Endpoint Picker scrapes `http://<podIP>:<port>/metrics` every 50 ms and
routes by what it reads, so the test must control those numbers: queue depth,
KV-cache usage and `vllm:cache_config_info` (block size, GPU blocks). The
server also answers `/v1/*` like a tiny vLLM so the real cache front can sit in
front of it (the other pod shape) and so a test can see which pod served what.
It binds only the loopback address it is given.
"""

from __future__ import annotations

import dataclasses
import json
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

MAX_BODY_BYTES = 8 * 1024 * 1024


@dataclass
class VllmMetrics:
    """The values a vLLM pod reports; the test changes them while the EPP scrapes."""

    model_name: str = "test-model"
    waiting: int = 0
    running: int = 0
    kv_cache_usage: float = 0.0
    block_size: int = 16
    num_gpu_blocks: int = 31250
    prefix_cache_queries: int = 0
    prefix_cache_hits: int = 0


def render_metrics(m: VllmMetrics) -> str:
    """vLLM's own exposition for the metrics the EPP reads (same names, labels, types)."""
    labels = f'engine="0",model_name="{m.model_name}"'
    cache_labels = (
        f'block_size="{m.block_size}",cache_dtype="auto",calculate_kv_scales="False",'
        f'cpu_offload_gb="0",enable_prefix_caching="True",engine="0",'
        f'gpu_memory_utilization="0.9",is_attention_free="False",'
        f'num_cpu_blocks="None",num_gpu_blocks="{m.num_gpu_blocks}",'
        f'num_gpu_blocks_override="None",prefix_caching_hash_algo="sha256",'
        f'sliding_window="None",swap_space="4",swap_space_bytes="4294967296"'
    )
    return (
        "# HELP vllm:num_requests_running Number of requests in model execution batches.\n"
        "# TYPE vllm:num_requests_running gauge\n"
        f"vllm:num_requests_running{{{labels}}} {float(m.running)}\n"
        "# HELP vllm:num_requests_waiting Number of requests waiting to be processed.\n"
        "# TYPE vllm:num_requests_waiting gauge\n"
        f"vllm:num_requests_waiting{{{labels}}} {float(m.waiting)}\n"
        "# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.\n"
        "# TYPE vllm:kv_cache_usage_perc gauge\n"
        f"vllm:kv_cache_usage_perc{{{labels}}} {float(m.kv_cache_usage)}\n"
        "# HELP vllm:prefix_cache_queries_total Prefix cache queries, in queried tokens.\n"
        "# TYPE vllm:prefix_cache_queries_total counter\n"
        f"vllm:prefix_cache_queries_total{{{labels}}} {float(m.prefix_cache_queries)}\n"
        "# HELP vllm:prefix_cache_hits_total Prefix cache hits, in cached tokens.\n"
        "# TYPE vllm:prefix_cache_hits_total counter\n"
        f"vllm:prefix_cache_hits_total{{{labels}}} {float(m.prefix_cache_hits)}\n"
        "# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig\n"
        "# TYPE vllm:cache_config_info gauge\n"
        f"vllm:cache_config_info{{{cache_labels}}} 1.0\n"
    )


@dataclass
class ServedRequest:
    """One request the stand-in upstream answered (what reached the pod)."""

    path: str
    headers: dict[str, str]
    body: dict[str, Any]


@dataclass
class _State:
    metrics: VllmMetrics
    lock: threading.Lock = field(default_factory=threading.Lock)
    scrapes: int = 0
    served: list[ServedRequest] = field(default_factory=list)


class _Handler(BaseHTTPRequestHandler):
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:
        """Silence per-request logging: the EPP scrapes 20 times a second."""

    def _send(self, code: int, body: bytes, content_type: str) -> None:
        self.send_response(code)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:
        state = self.server.state
        if self.path.split("?")[0] == "/metrics":
            with state.lock:
                state.scrapes += 1
                text = render_metrics(state.metrics)
            self._send(200, text.encode(), "text/plain; version=0.0.4; charset=utf-8")
        elif self.path in ("/health", "/ready"):
            self._send(200, b"", "text/plain")
        elif self.path == "/v1/models":
            with state.lock:
                name = state.metrics.model_name
            payload = {"object": "list", "data": [{"id": name, "object": "model"}]}
            self._send(200, json.dumps(payload).encode(), "application/json")
        else:
            self._send(404, b"not found", "text/plain")

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        if length > MAX_BODY_BYTES:
            self._send(413, b"too large", "text/plain")
            return
        raw = self.rfile.read(length)
        try:
            body = json.loads(raw or b"{}")
        except json.JSONDecodeError:
            self._send(400, b"bad json", "text/plain")
            return
        if not isinstance(body, dict):
            self._send(400, b"body must be an object", "text/plain")
            return
        state = self.server.state
        with state.lock:
            state.served.append(
                ServedRequest(self.path, {k.lower(): v for k, v in self.headers.items()}, body)
            )
            model = state.metrics.model_name
        answer = {
            "id": "cmpl-standin",
            "object": "chat.completion" if "chat" in self.path else "text_completion",
            "model": body.get("model", model),
            "choices": [
                {
                    "index": 0,
                    "finish_reason": "stop",
                    "message": {"role": "assistant", "content": "ok"},
                    "text": "ok",
                }
            ],
            "usage": {
                "prompt_tokens": 1,
                "completion_tokens": 1,
                "total_tokens": 2,
                "prompt_tokens_details": {"cached_tokens": 0},
            },
        }
        self._send(200, json.dumps(answer).encode(), "application/json")


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A scraper hanging up mid-answer (the EPP stopping) is not an error here."""

    def __init__(self, address: tuple[str, int], state: _State) -> None:
        super().__init__(address, _Handler)
        self.state = state


class FakePod:
    """One pod's HTTP server on `ip:port`, started and stopped by the test."""

    def __init__(self, name: str, ip: str, port: int, metrics: VllmMetrics | None = None) -> None:
        if not ip.startswith("127."):
            raise ValueError(f"fake pods bind loopback only, got {ip}")
        self.name = name
        self.ip = ip
        self.port = port
        self._state = _State(metrics or VllmMetrics())
        self._server = _Server((ip, port), self._state)
        self._thread = threading.Thread(
            target=self._server.serve_forever, name=f"fakepod-{name}", daemon=True
        )

    @property
    def address(self) -> str:
        """`ip:port`, the form the EPP writes into x-gateway-destination-endpoint."""
        return f"{self.ip}:{self.port}"

    def start(self) -> FakePod:
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._thread.is_alive():  # shutdown() would wait forever on a never-started server
            self._server.shutdown()
            self._thread.join(timeout=5)
        self._server.server_close()

    def set(self, **values: Any) -> None:
        """Change reported metrics, e.g. `pod.set(waiting=50, kv_cache_usage=0.99)`."""
        with self._state.lock:
            for key, value in values.items():
                if not hasattr(self._state.metrics, key):
                    raise AttributeError(f"VllmMetrics has no field {key!r}")
                setattr(self._state.metrics, key, value)

    def snapshot(self) -> VllmMetrics:
        """A copy of the values currently reported."""
        with self._state.lock:
            return dataclasses.replace(self._state.metrics)

    @property
    def scrapes(self) -> int:
        with self._state.lock:
            return self._state.scrapes

    @property
    def served(self) -> list[ServedRequest]:
        with self._state.lock:
            return list(self._state.served)
