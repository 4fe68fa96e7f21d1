"""The JSON response every /api/v1 endpoint answers with: always 200-able, never a 500.

Starlette's JSONResponse raises on a string UTF-8 cannot encode (a job directory with a
non-UTF-8 name, a lone surrogate in a rank's `gpu_name`) and on NaN or infinity; this one
renders such content again with those values escaped or null (`llmmon.textsafe.json_ready`).
The common case pays nothing: the walk runs only after the plain rendering failed.
"""

from __future__ import annotations

from typing import Any

from fastapi.responses import JSONResponse

from llmmon.textsafe import json_ready


class SafeJSONResponse(JSONResponse):
    def render(self, content: Any) -> bytes:
        try:
            return super().render(content)
        except (UnicodeEncodeError, ValueError):  # ValueError: NaN or infinity
            return super().render(json_ready(content))
