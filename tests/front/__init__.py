"""Tests of the cache front (promptcache.front)."""
