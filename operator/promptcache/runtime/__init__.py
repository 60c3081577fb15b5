"""What the two data-plane processes run on, defined once: the cache front and the
gateway's policy step both use it, and neither imports the other.

- `runtime.refusals`: the refusals both word the same way (a body too large, a body too
  slow, a failure inside the process), as `tenancy.errors.FrontError`s.
- `runtime.spawn`: the bounded pool of spawned, nicer worker processes that decide large
  or dense JSON bodies off the event loop.
- `runtime.supervision`: the two ends of `--workers N` both share (a worker stops when its
  supervisor is gone; a supervisor ends its workers within a grace).

Below both processes, above `tenancy` and `contract`; framework-free (no aiohttp, no
gRPC), so each process keeps its own wire format.
"""
