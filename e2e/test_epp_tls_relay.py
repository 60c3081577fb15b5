"""The harness's TLS relay says why it could not reach the picker.

Without a reason, a relay that cannot reach the picker can only close the client's
connection, and grpcio reports `UNAVAILABLE: Socket closed`, which says nothing of the
cause (the benchmark once switched the picker's TLS off over exactly that). No cluster and
no picker binary: the failure is a port where nothing listens yet, as when GIE is still
making its key after its health port is up.
"""

from __future__ import annotations

import pytest

from e2e.epp.extproc import ExtProcClient, chat_body
from e2e.epp.process import free_port


def test_a_picker_not_listening_is_named_not_just_socket_closed() -> None:
    port = free_port()  # nothing listens here
    with (
        ExtProcClient(f"127.0.0.1:{port}", tls=True, timeout_s=10) as client,
        pytest.raises(ConnectionError) as caught,
    ):
        client.pick(chat_body("hello"))
    message = str(caught.value)
    assert f"TLS relay could not reach the picker on 127.0.0.1:{port}" in message
    assert "ConnectionRefusedError" in message
