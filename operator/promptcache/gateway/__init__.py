"""The gateway side of promptcache that runs as code: the Endpoint Picker's gateway policy step.

Everything else on the gateway path (the InferencePool, the EPP's config) is rendered
configuration. This package holds the one program promptcache ships there: an ext_proc
proxy in the EPP pod that lets a body's `user` field name the session (spec/004), which the
EPP itself cannot read. It knows nothing of Kubernetes; `settings` and `command` import
no gRPC, so `promptcache` works without the `gateway` extra.
"""
