"""Why an untrusted prompt-embeds payload was refused, as one exception tree.

    ValueError
    └── PayloadDecodeError            anything wrong with a client's payload
        ├── PayloadTooLargeError      over the byte cap (encoded or decoded)
        ├── PayloadEncodingError      not strict base64
        └── PayloadFormatError        not a torch.save of a tensor or mapping that
                                      torch.load(weights_only=True) accepts, or a
                                      malformed TurboQuant mapping / bad tensor

Subclassing ValueError lets callers that only know "bad input" catch it; the
subclasses let the cache front pick a precise HTTP 400/413 message. Torch-free,
so the front can name these without importing torch.
"""

from __future__ import annotations


class PayloadDecodeError(ValueError):
    """A prompt-embeds payload from a client could not be accepted."""


class PayloadTooLargeError(PayloadDecodeError):
    """The payload exceeds the configured byte cap."""


class PayloadEncodingError(PayloadDecodeError):
    """The payload is not strict base64."""


class PayloadFormatError(PayloadDecodeError):
    """The decoded bytes are not an acceptable serialized prompt-embeds payload."""
