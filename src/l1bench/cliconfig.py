"""``--config KEY=VALUE`` values typed by the config schema, before it validates them.

Snakemake reads a command-line value as an int, a float, ``True``/``False``, or else with
YAML's base loader, which leaves every scalar inside a list or mapping a string:
``levels=[1]`` arrives as ``["1"]``, ``'paper={outer_trials: 5}'`` as ``{"outer_trials": "5"}``,
``aggregate_only=true`` as ``"true"`` and ``device=3090`` as the integer 3090. :func:`typed`
gives each value the type the schema asks for at its place (``type``, ``oneOf``/``anyOf``
alternatives, array ``items``, object ``properties`` and ``additionalProperties``), and a
single value where the schema wants a list becomes a list of one (``levels=1``). A value it
cannot read as the wanted type is left as it came, for the schema to name.
"""

from __future__ import annotations

import re
from pathlib import Path

import yaml

#: The workflow's config schema, where the repository keeps it (an editable install).
SCHEMA = Path(__file__).resolve().parents[2] / "config/schemas/config.schema.yaml"

_TRUE = ("true", "yes", "on", "1")
_FALSE = ("false", "no", "off", "0")
_NULL = ("null", "~", "none")
_INTEGER = re.compile(r"[+-]?\d+")


def types_at(schema: dict) -> set[str]:
    """The JSON types ``schema`` allows (its ``type``, and those of its oneOf/anyOf
    alternatives); empty when it names none."""
    kinds = schema.get("type", [])
    found = {kinds} if isinstance(kinds, str) else set(kinds)
    for alternative in schema.get("oneOf", []) + schema.get("anyOf", []):
        found |= types_at(alternative)
    return found


def _number(text: str, types: set[str]):
    if _INTEGER.fullmatch(text):
        return int(text)
    if "number" in types:
        try:
            return float(text)
        except ValueError:
            pass
    return text


def _scalar(value, types: set[str]):
    """A scalar typed as one of ``types``; as it came when none fits."""
    if isinstance(value, bool):
        return value
    if isinstance(value, (int, float)):
        if "boolean" in types and value in (0, 1) and not types & {"integer", "number"}:
            return bool(value)
        if isinstance(value, int) and "integer" in types or "number" in types:
            return value
        return str(value) if "string" in types else value
    if not isinstance(value, str):
        return value
    text = value.strip().lower()
    if "null" in types and text in _NULL:
        return None
    if "boolean" in types and text in _TRUE + _FALSE:
        return text in _TRUE
    if types & {"integer", "number"}:
        number = _number(value.strip(), types)
        if not isinstance(number, str):
            return number
    if types & {"array", "object"} and text[:1] in ("[", "{"):
        try:
            return yaml.safe_load(value)
        except yaml.YAMLError:
            return value
    return value


def typed(value, schema: dict):
    """``value`` as the schema at its place wants it (see the module's docstring)."""
    types = types_at(schema)
    if not types:
        return value
    value = _scalar(value, types)
    if isinstance(value, list) and "array" in types:
        return [typed(item, schema.get("items", {})) for item in value]
    if isinstance(value, dict) and "object" in types:
        return {key: typed(item, _property(schema, key)) for key, item in value.items()}
    if types == {"array"} or types == {"array", "null"} and value is not None:
        return [typed(value, schema.get("items", {}))]  # one value for a list: a list of one
    return value


def _property(schema: dict, key: str) -> dict:
    """The schema of an object's ``key`` (its property, else additionalProperties if a schema)."""
    known = schema.get("properties", {})
    if key in known:
        return known[key]
    extra = schema.get("additionalProperties")
    return extra if isinstance(extra, dict) else {}


def normalise(config: dict, schema: dict | str | Path = SCHEMA) -> None:
    """Type every value of ``config`` in place by ``schema`` (a schema, or its YAML file)."""
    if not isinstance(schema, dict):
        schema = yaml.safe_load(Path(schema).read_text())
    for key, value in list(config.items()):
        config[key] = typed(value, _property(schema, key))
