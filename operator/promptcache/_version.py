"""The one place the distribution's version is written; packaging and `promptcache version` read it."""

__version__ = "0.1.0"
