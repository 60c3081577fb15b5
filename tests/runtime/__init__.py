"""Tests of what the cache front and the policy step share (promptcache.runtime)."""
