"""The one place the version is written; packaging and `promptcache version` read it."""

__version__ = "0.1.0"
