"""Decoding untrusted payloads: strict base64, byte caps, weights_only, exact messages."""

from __future__ import annotations

import base64
import io
import pickle
import re
import zipfile

import pytest
import torch

from promptcache.embeds import (
    PayloadDecodeError,
    PayloadEncodingError,
    PayloadFormatError,
    PayloadTooLargeError,
    compute_prompt_embeds_id,
    decode_payload,
    encode_payload,
    identify_payload,
    turboquant,
)
from promptcache.embeds.wire import max_encoded_length

pytestmark = pytest.mark.torch

CAP = 1 << 20


def b64_of_save(obj: object) -> str:
    buf = io.BytesIO()
    torch.save(obj, buf)
    return base64.b64encode(buf.getvalue()).decode()


class Evil:
    def __reduce__(self) -> tuple[object, tuple[str]]:
        return (print, ("pwned",))


def test_round_trip_of_tensor_and_mapping() -> None:
    t = torch.randn(1, 5, 32).to(torch.bfloat16)
    got = decode_payload(encode_payload(t), max_bytes=CAP)
    assert isinstance(got, torch.Tensor)
    assert torch.equal(got, t)
    payload = turboquant.encode(torch.randn(4, 64), 3)
    loaded, ident = identify_payload(encode_payload(payload), max_bytes=CAP)
    assert ident == compute_prompt_embeds_id(payload)
    assert isinstance(loaded, dict)


def test_error_classes_form_one_tree() -> None:
    for cls in (PayloadTooLargeError, PayloadEncodingError, PayloadFormatError):
        assert issubclass(cls, PayloadDecodeError)
    assert issubclass(PayloadDecodeError, ValueError)


def test_max_encoded_length() -> None:
    assert [max_encoded_length(n) for n in (0, 1, 2, 3, 4)] == [0, 4, 4, 4, 8]


GOOD = encode_payload(torch.ones(2, 4))


BAD: list[tuple[str, str, type[Exception], str]] = [
    ("empty", "", PayloadEncodingError, "prompt_embeds payload is empty"),
    (
        "whitespace",
        GOOD[:8] + "\n" + GOOD[8:],
        PayloadEncodingError,
        "prompt_embeds payload is not valid base64 (standard alphabet, padded, no whitespace)",
    ),
    ("urlsafe alphabet", "ab-_", PayloadEncodingError, "not valid base64"),
    ("missing padding", GOOD.rstrip("=")[:-1], PayloadEncodingError, "not valid base64"),
    ("non-ascii", "AAAA\u00e9AAA", PayloadEncodingError, "not valid base64"),
    (
        "not a zip",
        base64.b64encode(b"hello world!").decode(),
        PayloadFormatError,
        "prompt_embeds payload is not what torch.save of a tensor or a TurboQuant mapping "
        "writes: not a zip archive",
    ),
    (
        "pickle gadget",
        b64_of_save(Evil()),
        PayloadFormatError,
        "prompt_embeds payload is not a loadable torch.save of a tensor: ",
    ),
    (
        "raw pickle",
        base64.b64encode(pickle.dumps(Evil())).decode(),
        PayloadFormatError,
        "not a zip archive (the legacy format is not accepted)",
    ),
    (
        "a list",
        b64_of_save([torch.ones(2)]),
        PayloadFormatError,
        "prompt_embeds payload must be a torch.save of a tensor or a TurboQuant mapping, got list",
    ),
    (
        "an int",
        b64_of_save(3),
        PayloadFormatError,
        "must be a torch.save of a tensor or a TurboQuant mapping, got int",
    ),
    ("a string", b64_of_save("blake3:00"), PayloadFormatError, "got str"),
    (
        "stride-0 view",
        b64_of_save(torch.ones(1, 4).expand(100_000, 4)),
        PayloadFormatError,
        "prompt_embeds payload holds a tensor view larger than the data it carries",
    ),
]


@pytest.mark.parametrize(("case", "text", "error", "message"), BAD, ids=[b[0] for b in BAD])
def test_bad_payloads_get_exact_messages(
    case: str, text: str, error: type[Exception], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(error, match=re.escape(message)):
        decode_payload(text, max_bytes=CAP)
    assert "pwned" not in capsys.readouterr().out, case


def test_size_caps_on_encoded_and_decoded_bytes() -> None:
    t = torch.zeros(64, 64)  # 16 KiB of data
    text = encode_payload(t)
    raw_len = len(base64.b64decode(text))
    assert decode_payload(text, max_bytes=raw_len) is not None
    with pytest.raises(
        PayloadTooLargeError,
        match=f"prompt_embeds payload decodes to {raw_len} bytes; the limit is {raw_len - 1}",
    ):
        decode_payload(text, max_bytes=raw_len - 1)
    with pytest.raises(
        PayloadTooLargeError,
        match=re.escape(
            f"prompt_embeds payload is {len(text)} base64 characters; the limit is 4 (1 decoded bytes)"
        ),
    ):
        decode_payload(text, max_bytes=1)


def test_non_str_input_is_a_programming_error() -> None:
    with pytest.raises(TypeError, match="decode_payload expects the base64 text as str, got bytes"):
        decode_payload(GOOD.encode(), max_bytes=CAP)  # type: ignore[arg-type]


def test_truncated_zip_is_refused() -> None:
    raw = base64.b64decode(GOOD)
    text = base64.b64encode(raw[: len(raw) // 2]).decode()
    with pytest.raises(PayloadFormatError, match=re.escape("not a zip archive")):
        decode_payload(text, max_bytes=CAP)


def test_identify_turns_id_errors_into_format_errors() -> None:
    malformed = dict(turboquant.encode(torch.randn(2, 8), 2))
    malformed["bits"] = 9
    with pytest.raises(
        PayloadFormatError,
        match=re.escape(
            "invalid prompt_embeds payload: TurboQuant field 'bits' must be in 1..4, got 9"
        ),
    ):
        identify_payload(b64_of_save(malformed), max_bytes=CAP)
    malformed["bits"] = 2
    malformed["codes"] = [1, 2]
    with pytest.raises(
        PayloadFormatError,
        match=re.escape(
            "invalid prompt_embeds payload: TurboQuant field 'codes' must be a torch.Tensor, got list"
        ),
    ):
        identify_payload(b64_of_save(malformed), max_bytes=CAP)
    with pytest.raises(
        PayloadFormatError,
        match=re.escape(
            "invalid prompt_embeds payload: prompt_embeds tensor has layout torch.sparse_coo"
        ),
    ):
        identify_payload(b64_of_save(torch.eye(3).to_sparse()), max_bytes=CAP)


def test_zip_is_stored_not_compressed_so_decoded_size_is_bounded() -> None:
    """torch.save writes ZIP_STORED members: the byte cap also bounds the tensors."""
    with zipfile.ZipFile(io.BytesIO(base64.b64decode(GOOD))) as archive:
        assert {info.compress_type for info in archive.infolist()} == {zipfile.ZIP_STORED}
