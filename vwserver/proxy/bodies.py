"""PLACEHOLDER (to be replaced by the bounded decoder being written in parallel)."""

from __future__ import annotations

from typing import Any

import msgspec
import yaml

from vwserver.errors import BadRequest


def decode_json(raw: bytes) -> Any:
    try:
        return msgspec.json.decode(raw)
    except msgspec.DecodeError as e:
        raise BadRequest(f"the request body is not valid JSON: {e}") from e


def decode_yaml(raw: bytes) -> Any:
    try:
        return yaml.safe_load(raw)
    except yaml.YAMLError as e:
        raise BadRequest(f"apply patch is not valid YAML: {e}") from e
