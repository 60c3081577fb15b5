"""The cache front's settings: each variable, flag, parser, default and bounds, declared once.

The renderer writes these variables into the `cache-front` container; `promptcache
front` reads them (flags winning) with the parsers named here into `FrontSettings`, which
checks every value against its row (`contract.settings.check_rows`).
"""

from __future__ import annotations

from typing import Any, Final

from promptcache.contract.cache_size import check_cache_gib, parse_cache_gib
from promptcache.contract.engine import VLLM_DEFAULT_MAX_NUM_SEQS
from promptcache.contract.names import (
    DEFAULT_CACHED_PROMPT_TOKENS_HEADER,
    DEFAULT_ISOLATION_FIELD,
    DEFAULT_ISOLATION_HEADER,
    DEFAULT_PROMPT_TOKENS_HEADER,
    DEFAULT_SESSION_HEADER,
    SALT_KEY_FILE,
    SERVING_PORT,
    SG_PROMPT_EMBEDS_CACHE_GIB_ENV_VAR,
    VLLM_LOCAL_PORT,
    IsolationMode,
)
from promptcache.contract.settings import (
    Bounds,
    Setting,
    SettingsError,
    as_float,
    as_int,
    as_str,
    check_host_port,
    check_optional_body_field,
    check_optional_header_name,
    check_optional_host_port,
    parse_bool,
    parse_host_port,
    parse_isolation_mode,
    parse_optional_body_field,
    parse_optional_header_name,
)


class FrontEnv:
    """Environment variables the renderer sets on the cache-front container.

    Each has a matching `promptcache front` flag; the flag wins when both are given.
    """

    UPSTREAM: Final[str] = "PROMPTCACHE_UPSTREAM"
    LISTEN: Final[str] = "PROMPTCACHE_LISTEN"
    ISOLATION_MODE: Final[str] = "PROMPTCACHE_ISOLATION_MODE"
    ISOLATION_HEADER: Final[str] = "PROMPTCACHE_ISOLATION_HEADER"
    ISOLATION_FIELD: Final[str] = "PROMPTCACHE_ISOLATION_FIELD"
    SALT_KEY_FILE: Final[str] = "PROMPTCACHE_SALT_KEY_FILE"
    HONOR_MAX_LEN: Final[str] = "PROMPTCACHE_HONOR_PROMPT_CACHE_MAX_LEN"
    SESSION_HEADER: Final[str] = "PROMPTCACHE_SESSION_HEADER"
    SESSION_FROM_USER: Final[str] = "PROMPTCACHE_SESSION_FROM_USER"
    PROMPT_TOKENS_HEADER: Final[str] = "PROMPTCACHE_PROMPT_TOKENS_HEADER"
    CACHED_PROMPT_TOKENS_HEADER: Final[str] = "PROMPTCACHE_CACHED_PROMPT_TOKENS_HEADER"
    MAX_BODY_BYTES: Final[str] = "PROMPTCACHE_MAX_BODY_BYTES"
    WORKERS: Final[str] = "PROMPTCACHE_WORKERS"
    """Front processes sharing the serving port (SO_REUSEPORT), one per vLLM API server, each
    with its own prompt-embeds cache: the renderer sets it to `engine.apiServerCount`, which
    is why the per-pod ceiling is apiServerCount x SG_PROMPT_EMBEDS_CACHE_GIB (spec/000)."""
    MAX_IN_FLIGHT: Final[str] = "PROMPTCACHE_MAX_IN_FLIGHT"
    """Requests the front works on at once; more get HTTP 503 (bounds its memory)."""
    MAX_IN_FLIGHT_BYTES: Final[str] = "PROMPTCACHE_MAX_IN_FLIGHT_BYTES"
    """Bytes of request bodies (as read, parsed and forwarded) a front process holds at
    once; a request that would exceed it gets 503. Set it to the memory the container
    has beyond the cache ceiling."""
    DECODE_WORKERS: Final[str] = "PROMPTCACHE_DECODE_WORKERS"
    """Threads for base64/torch.load/hashing, kept off the event loop."""
    TURBOQUANT_DTYPE: Final[str] = "PROMPTCACHE_TURBOQUANT_DTYPE"
    """The dtype TurboQuant payloads are decoded to before vLLM sees them."""
    UPSTREAM_TIMEOUT_SECONDS: Final[str] = "PROMPTCACHE_UPSTREAM_TIMEOUT_SECONDS"
    """Longest the front waits for vLLM to start answering a request."""
    MAX_BODY_READS: Final[str] = "PROMPTCACHE_MAX_BODY_READS"
    """Request bodies a front process receives at once (separate from MAX_IN_FLIGHT)."""
    HEADER_TIMEOUT_SECONDS: Final[str] = "PROMPTCACHE_HEADER_TIMEOUT_SECONDS"
    """Time a connection has to deliver a request's headers (also the keep-alive idle time)."""
    BODY_TIMEOUT_SECONDS: Final[str] = "PROMPTCACHE_BODY_TIMEOUT_SECONDS"
    """Time a request has to deliver its whole body (HTTP 408 after)."""
    WRITE_TIMEOUT_SECONDS: Final[str] = "PROMPTCACHE_WRITE_TIMEOUT_SECONDS"
    """Longest a write to a client may wait for it to read (then the connection is cut and
    the request's slot freed)."""
    SEND_BUFFER_BYTES: Final[str] = "PROMPTCACHE_SEND_BUFFER_BYTES"
    """Answer bytes the front queues per connection before it waits for the client."""
    MAX_PROMPT_EMBEDS_REFERENCES: Final[str] = "PROMPTCACHE_MAX_PROMPT_EMBEDS_REFERENCES"
    """Prompt-embeds payloads and references one request may carry."""
    ALLOW_ENGINE_STATE: Final[str] = "PROMPTCACHE_ALLOW_ENGINE_STATE"
    """Forward the request fields through which a client reaches vLLM's state
    (`VLLM_ENGINE_STATE_FIELDS`); false: a non-null one is refused."""
    ALLOW_CLIENT_PRIORITY: Final[str] = "PROMPTCACHE_ALLOW_CLIENT_PRIORITY"
    LIFECYCLE_LISTEN: Final[str] = "PROMPTCACHE_LIFECYCLE_LISTEN"
    """Loopback HOST:PORT held open while the process lives (the vllm preStop waits on it)."""
    LAME_DUCK_SECONDS: Final[str] = "PROMPTCACHE_LAME_DUCK_SECONDS"
    """Seconds the front keeps serving after SIGTERM before it stops listening and drains."""
    """Let clients set vLLM's scheduling priority (`X-Vllm-Priority`, body `priority`);
    false: the header is removed and a non-zero `priority` is refused."""
    FAIR_SHARE_BYTES_PER_SECOND: Final[str] = "PROMPTCACHE_FAIR_SHARE_BYTES_PER_SECOND"
    """Decoding work (bytes a body's parse materialises) each key may cost the front per
    second while other keys are active (`tenancy.fair_share`); 0: unmetered."""
    TENANT_SHARE_PERCENT: Final[str] = "PROMPTCACHE_TENANT_SHARE_PERCENT"
    """The most of a process's concurrency slots, body reads and memory budget one client
    identity may hold, in percent (`tenancy.shares`); 100: no per-identity share."""
    IDENTITY_HEADER: Final[str] = "PROMPTCACHE_IDENTITY_HEADER"
    """The header the gateway's authentication sets to the caller's account; empty: none."""
    IDENTITY_BEARER: Final[str] = "PROMPTCACHE_IDENTITY_BEARER"
    """Name the account by the HMAC of the request's bearer token."""
    IDENTITY_REQUIRED: Final[str] = "PROMPTCACHE_IDENTITY_REQUIRED"
    """Refuse a request without an authenticated account (HTTP 401 `identity_required`)."""


# --- defaults: a process started with no flags and no variables fits the rendered pod ----
DEFAULT_UPSTREAM: Final[str] = f"http://127.0.0.1:{VLLM_LOCAL_PORT}"
DEFAULT_LISTEN: Final[str] = f"0.0.0.0:{SERVING_PORT}"
DEFAULT_ISOLATION_MODE: Final[IsolationMode] = IsolationMode.SHARED
"""The process default (no salt key needed); the resource's default is PerKey."""
DEFAULT_HONOR_MAX_LEN: Final[bool] = True
DEFAULT_SESSION_FROM_USER: Final[bool] = True
DEFAULT_MAX_BODY_BYTES: Final[int] = 32 * 1024 * 1024
"""vLLM's Rust frontend enforces 32 MiB; its Python server enforces nothing."""
DEFAULT_CACHE_GIB: Final[float] = 0.0
DEFAULT_WORKERS: Final[int] = 1
DEFAULT_MAX_IN_FLIGHT: Final[int] = VLLM_DEFAULT_MAX_NUM_SEQS
"""vLLM's default `--max-num-seqs`: the front must not refuse what vLLM would run or queue."""
DEFAULT_MAX_BODY_READS: Final[int] = 128
"""Request bodies being received at once; slow senders wait here, not in the in-flight cap."""
DEFAULT_HEADER_TIMEOUT_SECONDS: Final[float] = 30.0
"""A connection must deliver a request's headers within this (also the idle keep-alive)."""
DEFAULT_BODY_TIMEOUT_SECONDS: Final[float] = 60.0
"""A request's body must arrive whole within this (a 256 MiB body at 5 MB/s takes ~50 s)."""
DEFAULT_MAX_PROMPT_EMBEDS_REFERENCES: Final[int] = 1024
"""Prompt-embeds payloads and references one request may carry."""
DEFAULT_WRITE_TIMEOUT_SECONDS: Final[float] = 30.0
"""A client that reads nothing of its answer for this long is cut off (its slot freed)."""
DEFAULT_SEND_BUFFER_BYTES: Final[int] = 256 * 1024
"""Answer bytes queued per connection (beyond the kernel's socket buffer) before waiting."""
DEFAULT_MAX_IN_FLIGHT_BYTES: Final[int] = 1 << 30
"""The renderer never sets less (it raises it to fit one maximal request) and gives the
container this much memory per process above the cache ceiling."""
DEFAULT_DECODE_WORKERS: Final[int] = 2
DEFAULT_FAIR_SHARE_BYTES_PER_SECOND: Final[int] = 8 * 1024 * 1024
"""8 MiB of materialised parse a second per key while others are active: a 4 MiB text
prompt a second, or a 128k-token prompt of token ids (~6.5 MiB); a dense 4 MiB body of
2M values (~104 MiB) then waits 10 s. Measured on one core, a pod parses about 60 MiB of
it a second (front and engine), so one key takes at most ~13 % of a busy pod's core
(docs/cache-front.md, "Fair share between tenants")."""
DEFAULT_TENANT_SHARE_PERCENT: Final[int] = 50
"""One client identity holds at most half of each bounded resource of a process (slots,
body reads, memory budget), so no single identity can refuse everyone else; a lone
client still gets half of the process (docs/cache-front.md, "Shares of slots and
memory")."""
MAXIMAL_REQUESTS_PER_BUDGET: Final[int] = 4
"""The front's rendered memory budget holds at least this many maximal requests, so one
request's working memory is a quarter of it at most, and one client's share holds a
maximal request whatever the share (`budget_for`)."""


def budget_for(floor: int, one_request: int, share_percent: int) -> int:
    """The memory budget the renderer gives a process whose maximal request needs
    `one_request` bytes of working memory: at least `floor`, at least
    `MAXIMAL_REQUESTS_PER_BUDGET` maximal requests, and enough that one client's share
    (`share_percent` of it) still holds one maximal request (else its 413 would refuse
    requests the size limit allows)."""
    within_share = -(-one_request * 100 // share_percent)  # ceiling division
    return max(floor, MAXIMAL_REQUESTS_PER_BUDGET * one_request, within_share)


TURBOQUANT_DTYPES: Final[tuple[str, ...]] = ("auto", "float32", "float16", "bfloat16")
DEFAULT_TURBOQUANT_DTYPE: Final[str] = "auto"
"""auto: decode to the dtype the client compressed from (vLLM casts to the model dtype)."""
DEFAULT_UPSTREAM_TIMEOUT_SECONDS: Final[float] = 600.0
DEFAULT_LIFECYCLE_LISTEN: Final[str] = ""
"""Off for a process started by hand; the renderer sets 127.0.0.1:FRONT_LIFECYCLE_PORT."""
DEFAULT_LAME_DUCK_SECONDS: Final[float] = 0.0
"""A process started by hand stops listening at once; the renderer sets
FRONT_LAME_DUCK_SECONDS."""
DEFAULT_ALLOW_ENGINE_STATE: Final[bool] = False
DEFAULT_IDENTITY_HEADER: Final[str] = ""
"""No identity header: the account is not read from the gateway's authentication."""
DEFAULT_IDENTITY_BEARER: Final[bool] = False
DEFAULT_IDENTITY_REQUIRED: Final[bool] = False
VLLM_ENGINE_STATE_FIELDS: Final[tuple[str, ...]] = (
    "previous_response_id",
    "kv_transfer_params",
    "vllm_xargs",
    "session_id",
)
"""Request fields of vLLM 0.33.0's request models through which a client reaches engine
state beyond its own request: another stored response (`previous_response_id`, the
Responses API), KV blocks to pull from or push to another engine (`kv_transfer_params`),
arbitrary arguments to engine plugins (`vllm_xargs`), a session identity shared with
other requests (`session_id`, new in 0.33.0; what the engine keys by it is not
documented, so it is treated as shared state). Derived from the request models
(`tests/front/test_front_vllm_fields.py` fails when vLLM adds another such field)."""
DEFAULT_ALLOW_CLIENT_PRIORITY: Final[bool] = False
"""With vLLM's `--scheduling-policy priority` a client's priority moves it ahead of other
tenants in the queue; only a deployment that trusts its clients with that turns it on."""
VLLM_PRIORITY_HEADER: Final[str] = "x-vllm-priority"
"""The header vLLM 0.33.0 reads a request's priority from (it wins over the body's)."""
VLLM_PRIORITY_FIELD: Final[str] = "priority"
VLLM_REQUEST_ID_HEADER: Final[str] = "x-request-id"
"""The header vLLM takes a request's id from (engine id, logs, `--enable-request-id-headers`)."""
VLLM_REQUEST_ID_FIELD: Final[str] = "request_id"


MIN_MAX_BODY_BYTES: Final[int] = 1024
"""The smallest body limit a process accepts (the API's floor on `front.maxRequestBytes`)."""
MIN_SEND_BUFFER_BYTES: Final[int] = 4096
"""The smallest answer buffer per connection (the API's floor on `front.sendBufferBytes`)."""
MAX_LAME_DUCK_SECONDS: Final[float] = 600.0
"""A longer lame duck is a typo: the pod's grace period must outlast it."""
AT_LEAST_ONE: Final[Bounds[int]] = Bounds(1)
POSITIVE_SECONDS: Final[Bounds[float]] = Bounds(0.0, above=True)


def _dtype(name: str, raw: str) -> str:
    value = raw.strip()
    if value not in TURBOQUANT_DTYPES:
        raise SettingsError(f"{name}={raw!r} is not one of {', '.join(TURBOQUANT_DTYPES)}")
    return value


FRONT_SETTINGS: Final[tuple[Setting[Any], ...]] = (
    Setting("upstream", "--upstream", FrontEnv.UPSTREAM, as_str, DEFAULT_UPSTREAM,
            "vLLM's base URL (localhost)"),  # an http URL: FrontSettings checks (no urllib here)
    Setting("listen", "--listen", FrontEnv.LISTEN, parse_host_port, DEFAULT_LISTEN,
            "HOST:PORT to serve on", check=check_host_port),
    Setting("isolation_mode", "--isolation-mode", FrontEnv.ISOLATION_MODE,
            parse_isolation_mode, DEFAULT_ISOLATION_MODE, "Shared, PerKey or Required"),
    Setting("isolation_header", "--isolation-header", FrontEnv.ISOLATION_HEADER,
            parse_optional_header_name, DEFAULT_ISOLATION_HEADER,
            "request header carrying the isolation key; empty: do not read one",
            empty_is_unset=False, check=check_optional_header_name),
    Setting("isolation_field", "--isolation-field", FrontEnv.ISOLATION_FIELD,
            parse_optional_body_field, DEFAULT_ISOLATION_FIELD,
            "body field carrying the isolation key; empty: do not read one",
            empty_is_unset=False, check=check_optional_body_field),
    Setting("salt_key_file", "--salt-key-file", FrontEnv.SALT_KEY_FILE, as_str, SALT_KEY_FILE,
            "file holding the HMAC secret for salts (PerKey/Required)"),
    Setting("honor_prompt_cache_max_len", "--honor-prompt-cache-max-len",
            FrontEnv.HONOR_MAX_LEN, parse_bool, DEFAULT_HONOR_MAX_LEN,
            "true: prompt_cache_max_len 0 makes a request uncacheable"),
    Setting("session_header", "--session-header", FrontEnv.SESSION_HEADER,
            parse_optional_header_name, DEFAULT_SESSION_HEADER,
            "session-affinity header; empty: never set it", empty_is_unset=False,
            check=check_optional_header_name),
    Setting("session_from_user", "--session-from-user", FrontEnv.SESSION_FROM_USER,
            parse_bool, DEFAULT_SESSION_FROM_USER,
            "copy the body's `user` into the session header when it is absent"),
    Setting("prompt_tokens_header", "--prompt-tokens-header", FrontEnv.PROMPT_TOKENS_HEADER,
            parse_optional_header_name, DEFAULT_PROMPT_TOKENS_HEADER,
            "response header with the prompt token count; empty: off", empty_is_unset=False,
            check=check_optional_header_name),
    Setting("cached_prompt_tokens_header", "--cached-prompt-tokens-header",
            FrontEnv.CACHED_PROMPT_TOKENS_HEADER, parse_optional_header_name,
            DEFAULT_CACHED_PROMPT_TOKENS_HEADER,
            "response header with the cached prompt token count; empty: off",
            empty_is_unset=False, check=check_optional_header_name),
    Setting("max_body_bytes", "--max-body-bytes", FrontEnv.MAX_BODY_BYTES, as_int,
            DEFAULT_MAX_BODY_BYTES, "largest request body accepted (413 above)",
            bounds=Bounds(MIN_MAX_BODY_BYTES)),
    Setting("prompt_embeds_cache_gib", "--prompt-embeds-cache-gib",
            SG_PROMPT_EMBEDS_CACHE_GIB_ENV_VAR, parse_cache_gib, DEFAULT_CACHE_GIB,
            "prompt-embeds cache size per process in GiB; 0 = off", empty_is_unset=False,
            check=check_cache_gib),
    Setting("workers", "--workers", FrontEnv.WORKERS, as_int, DEFAULT_WORKERS,
            "front processes on the port (SO_REUSEPORT), one per vLLM API server",
            bounds=AT_LEAST_ONE),
    Setting("max_in_flight", "--max-in-flight", FrontEnv.MAX_IN_FLIGHT, as_int,
            DEFAULT_MAX_IN_FLIGHT, "requests worked on at once per process (503 above)",
            bounds=AT_LEAST_ONE),
    Setting("max_in_flight_bytes", "--max-in-flight-bytes", FrontEnv.MAX_IN_FLIGHT_BYTES,
            as_int, DEFAULT_MAX_IN_FLIGHT_BYTES,
            "request bytes held at once per process (503 above)"),
    Setting("decode_workers", "--decode-workers", FrontEnv.DECODE_WORKERS, as_int,
            DEFAULT_DECODE_WORKERS, "threads for payload decoding and hashing",
            bounds=AT_LEAST_ONE),
    Setting("turboquant_dtype", "--turboquant-dtype", FrontEnv.TURBOQUANT_DTYPE, _dtype,
            DEFAULT_TURBOQUANT_DTYPE, "dtype TurboQuant payloads are decoded to", check=_dtype),
    Setting("upstream_timeout_seconds", "--upstream-timeout-seconds",
            FrontEnv.UPSTREAM_TIMEOUT_SECONDS, as_float, DEFAULT_UPSTREAM_TIMEOUT_SECONDS,
            "longest silence from vLLM before 504", bounds=POSITIVE_SECONDS),
    Setting("max_body_reads", "--max-body-reads", FrontEnv.MAX_BODY_READS, as_int,
            DEFAULT_MAX_BODY_READS,
            "request bodies received at once per process (503 above; apart from --max-in-flight)",
            bounds=AT_LEAST_ONE),
    Setting("header_timeout_seconds", "--header-timeout-seconds",
            FrontEnv.HEADER_TIMEOUT_SECONDS, as_float, DEFAULT_HEADER_TIMEOUT_SECONDS,
            "time to deliver a request's headers; also the idle keep-alive time",
            bounds=POSITIVE_SECONDS),
    Setting("body_timeout_seconds", "--body-timeout-seconds", FrontEnv.BODY_TIMEOUT_SECONDS,
            as_float, DEFAULT_BODY_TIMEOUT_SECONDS,
            "time to deliver a whole request body (408 after)", bounds=POSITIVE_SECONDS),
    Setting("write_timeout_seconds", "--write-timeout-seconds", FrontEnv.WRITE_TIMEOUT_SECONDS,
            as_float, DEFAULT_WRITE_TIMEOUT_SECONDS,
            "longest wait for a client to read its answer (then the connection is cut)",
            bounds=POSITIVE_SECONDS),
    Setting("send_buffer_bytes", "--send-buffer-bytes", FrontEnv.SEND_BUFFER_BYTES, as_int,
            DEFAULT_SEND_BUFFER_BYTES, "answer bytes queued per connection before waiting",
            bounds=Bounds(MIN_SEND_BUFFER_BYTES)),
    Setting("max_prompt_embeds_references", "--max-prompt-embeds-references",
            FrontEnv.MAX_PROMPT_EMBEDS_REFERENCES, as_int, DEFAULT_MAX_PROMPT_EMBEDS_REFERENCES,
            "prompt-embeds payloads and references one request may carry (400 above)",
            bounds=AT_LEAST_ONE),
    Setting("allow_engine_state", "--allow-engine-state", FrontEnv.ALLOW_ENGINE_STATE,
            parse_bool, DEFAULT_ALLOW_ENGINE_STATE,
            "forward previous_response_id, kv_transfer_params, vllm_xargs (false: refused)"),
    Setting("allow_client_priority", "--allow-client-priority",
            FrontEnv.ALLOW_CLIENT_PRIORITY, parse_bool, DEFAULT_ALLOW_CLIENT_PRIORITY,
            "forward X-Vllm-Priority and a body priority to vLLM (false: removed / refused)"),
    Setting("lifecycle_listen", "--lifecycle-listen", FrontEnv.LIFECYCLE_LISTEN, as_str,
            DEFAULT_LIFECYCLE_LISTEN,
            "loopback HOST:PORT open while the process lives (empty: none)",
            check=check_optional_host_port),
    Setting("lame_duck_seconds", "--lame-duck-seconds", FrontEnv.LAME_DUCK_SECONDS, as_float,
            DEFAULT_LAME_DUCK_SECONDS,
            "seconds still serving after SIGTERM (Connection: close, /readyz 503) before draining",
            bounds=Bounds(0.0, MAX_LAME_DUCK_SECONDS)),
    Setting("fair_share_bytes_per_second", "--fair-share-bytes-per-second",
            FrontEnv.FAIR_SHARE_BYTES_PER_SECOND, as_int, DEFAULT_FAIR_SHARE_BYTES_PER_SECOND,
            "decoding work (bytes a parse materialises) a key may cost per second while "
            "others are active; a key in debt waits (0: unmetered)", bounds=Bounds(0)),
    Setting("tenant_share_percent", "--tenant-share-percent", FrontEnv.TENANT_SHARE_PERCENT,
            as_int, DEFAULT_TENANT_SHARE_PERCENT,
            "most of the slots, body reads and memory budget one client identity may hold, "
            "in percent (429 above; 100: no share)", bounds=Bounds(1, 100)),
    Setting("identity_header", "--identity-header", FrontEnv.IDENTITY_HEADER,
            parse_optional_header_name, DEFAULT_IDENTITY_HEADER,
            "header the gateway's authentication sets to the caller's account; empty: none",
            empty_is_unset=False, check=check_optional_header_name),
    Setting("identity_bearer", "--identity-bearer", FrontEnv.IDENTITY_BEARER, parse_bool,
            DEFAULT_IDENTITY_BEARER, "name the account by the HMAC of the bearer token"),
    Setting("identity_required", "--identity-required", FrontEnv.IDENTITY_REQUIRED,
            parse_bool, DEFAULT_IDENTITY_REQUIRED,
            "refuse a request without an authenticated account (401 identity_required)"),
)  # fmt: skip
