"""promptcache: a Kubernetes operator that makes LLM prompt caching a one-resource affair.

The package is split by plane so heavy imports stay where they are needed:
`api`, `render` and `controller` form the control plane (no torch), `embeds`
and `front` the data plane (no Kubernetes).
"""

from promptcache._version import __version__

__all__ = ["__version__"]
