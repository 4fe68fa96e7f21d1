"""Text that every output can encode: label values, JSON bodies and log lines.

Names read from the file system arrive as `str` with undecodable bytes smuggled in as lone
surrogates (Python's surrogateescape), and spool JSON can carry lone surrogates of its own
(`"\\ud800"`).  UTF-8 cannot encode either, so an exposition, a JSON body or a log line
holding one would raise; these helpers write them as visible backslash escapes instead.
"""

from __future__ import annotations

import math
from typing import Any


def _escape(char: str) -> str:
    code = ord(char)
    if 0xDC80 <= code <= 0xDCFF:  # an undecodable byte, as os.listdir hands it over
        return f"\\x{code - 0xDC00:02x}"
    if 0xD800 <= code <= 0xDFFF:
        return f"\\u{code:04x}"
    return char


def printable(text: str) -> str:
    """`text` unchanged when UTF-8 can encode it, else with each surrogate escaped."""
    if text.isascii():
        return text
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return "".join(_escape(char) for char in text)
    return text


def json_ready(value: Any) -> Any:
    """`value` with every string (keys too) made printable and every non-finite float null:
    JSON has no NaN or Infinity, and strict clients reject them."""
    if isinstance(value, str):
        return printable(value)
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {json_ready(k) if isinstance(k, str) else k: json_ready(v)
                for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_ready(item) for item in value]
    return value
