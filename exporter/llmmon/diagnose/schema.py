"""The JSON Schema of a diagnosis report, generated from the model (docs/diagnose.schema.json).

    python -m llmmon.diagnose.schema > docs/diagnose.schema.json

A test fails when the committed schema and the model drift apart; `model.SCHEMA` names the
version every report carries.
"""

from __future__ import annotations

import json
import sys
from typing import Any

from pydantic import TypeAdapter

from llmmon.diagnose.model import SCHEMA, Report

ADAPTER = TypeAdapter(Report)


def schema() -> dict[str, Any]:
    document = ADAPTER.json_schema(mode="serialization")
    document["title"] = SCHEMA
    return document


def text() -> str:
    return json.dumps(schema(), indent=1, sort_keys=True) + "\n"


if __name__ == "__main__":
    sys.stdout.write(text())
