"""Harness that runs the real llm-d Endpoint Picker against fake model-server pods.

The gateway half of promptcache is only real if the Endpoint Picker (EPP) that
users run accepts the configuration the renderer writes and routes by it. This
package starts that real process, stands in for the model-server pods at the
system boundary (their Prometheus metrics and, for the cache-front shape, an
OpenAI-compatible upstream), and plays the gateway's part of the ext_proc
conversation. Everything binds to loopback only.
"""
