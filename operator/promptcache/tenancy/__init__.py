"""What both data-plane processes decide about a request, defined once.

The cache front (in each model-server pod, before vLLM) and the gateway's policy step
(beside the Endpoint Picker, before it hashes the prompt) must agree on every request:
which route it is (`routes`), how its body and headers are read (`canonical`), what the
tenant's salt is (`salt`), what is refused and with which error body (`policy`,
`errors`), and which settings those rules read (`settings`). Both import this package;
neither imports the other (the import contracts in pyproject.toml say so).
"""
