"""The model-list responder of a shared Gateway (`promptcache catalog`).

One `GET /v1/models` for every model and adapter that the PromptCacheDeployments routing by
model serve on a Gateway, and an OpenAI-shaped error for a request none of them serves.
It reads the resources (list and watch, `watch.py`), computes each answer with the pure
`render.model_list`, and answers over aiohttp (`app.py`); `serve.py` runs both. It writes
nothing to the cluster. docs/multi-model.md has the design and its reasons.
"""
