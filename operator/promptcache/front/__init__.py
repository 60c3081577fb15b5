"""The cache front: the per-request half of prompt caching, in every model-server pod.

An aiohttp server on the pod's serving port, in front of vLLM on localhost. It
turns isolation keys into HMAC salts, lets clients send prompt embeddings by
identifier, adds prompt-token headers, and serves vLLM's metrics merged with its
own. Modules: `settings` (configuration), `policy` (isolation, max_len, session),
`references` + `verify` (prompt embeds by reference), `offload` (large or dense
bodies decided in worker processes), `usage` (token counts,
SSE relay), `metrics`, `state`, `upstream` (forwarding), `pool` (the HTTP/1.1
client to vLLM), `app` (HTTP), `server`
(processes), `command` (CLI),
`client` (the helper clients and tests use). See docs/cache-front.md.
"""

from __future__ import annotations

from promptcache.front.settings import FrontSettings, SettingsError

__all__ = ["FrontSettings", "SettingsError"]
