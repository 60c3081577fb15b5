"""Harness that runs the real llm-d Endpoint Picker against fake model-server pods.

The gateway half of promptcache is only real if the Endpoint Picker (EPP) that
users run accepts the configuration the renderer writes and routes by it. This
package starts that real process, stands in for the model-server pods at the
system boundary (their Prometheus metrics and, for the cache-front shape, an
OpenAI-compatible upstream), and plays the gateway's part of the ext_proc
conversation. Everything binds to loopback only.
"""

import json
from pathlib import Path

ACCEPTED_PARAMETERS_FILE = Path(__file__).with_name("accepted_parameters.json")
"""Per plugin type, the keys its Go struct decodes, read from the pickers' sources (see
docs/endpoint-picker.md): every parameter the renderer emits must be one of them."""


def accepted_parameters() -> dict[str, list[str]]:
    loaded: dict[str, list[str]] = json.loads(ACCEPTED_PARAMETERS_FILE.read_text())
    return loaded
