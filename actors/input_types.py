"""The types an input table's columns may have (actors/schema.py names the columns), and the
check a table's schema must pass before any work starts: a required column missing, or a column
of a type no row could be read from, fails the table, naming the column. Everything else is
judged per row. Only pyarrow is imported: the driver uses this module.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

import pyarrow as pa

from actors import schema as S


def _is_text(t: pa.DataType) -> bool:
    return pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_string_view(t)


def _is_bytes(t: pa.DataType) -> bool:
    return pa.types.is_binary(t) or pa.types.is_large_binary(t) or pa.types.is_binary_view(t)


def _is_int_or_text(t: pa.DataType) -> bool:
    # numbers stored as text are parsed per row, so one bad value fails one row, not the table
    return pa.types.is_integer(t) or _is_text(t)


def _is_list(t: pa.DataType) -> bool:
    return pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t)


def _is_int_lists(t: pa.DataType) -> bool:
    return _is_list(t) and _is_list(t.value_type) and pa.types.is_integer(t.value_type.value_type)


def _is_number_or_text(t: pa.DataType) -> bool:
    return pa.types.is_integer(t) or pa.types.is_floating(t) or _is_text(t)


# each field a voice struct may have, and what its values must be
_VOICE_FIELDS = {S.VOICE_AUDIO: _is_bytes, S.VOICE_AUDIO_PATH: _is_text, S.VOICE_TEXT: _is_text}


def _is_voices(t: pa.DataType) -> bool:
    """A list of structs whose fields are among audio, audio_path, text and codes, each of its
    type (a null-typed field, all of whose values are null, passes)."""
    if not _is_list(t) or not pa.types.is_struct(t.value_type):
        return False
    for f in t.value_type:
        accepts = _is_int_lists if f.name == S.VOICE_CODES else _VOICE_FIELDS.get(f.name)
        if accepts is None or not (pa.types.is_null(f.type) or accepts(f.type)):
            return False
    return True


@dataclass(frozen=True)
class _ColumnKind:
    accepts: Callable[[pa.DataType], bool]
    expected: str


_KINDS = {
    S.ID: _ColumnKind(_is_text, "string"),
    S.TEXT: _ColumnKind(lambda t: _is_text(t) or _is_bytes(t), "string (or UTF-8 binary)"),
    S.REF_AUDIO: _ColumnKind(_is_bytes, "binary (WAV/FLAC/OGG bytes)"),
    S.REF_AUDIO_PATH: _ColumnKind(_is_text, "string"),
    S.REF_TEXT: _ColumnKind(_is_text, "string"),
    S.REF_ID: _ColumnKind(_is_text, "string"),
    S.REF_CODES: _ColumnKind(_is_int_lists, "list<list<integer>> ([num_codebooks][frames] codec codes)"),
    S.VOICES: _ColumnKind(
        _is_voices,
        "list<struct<audio: binary, audio_path: string, text: string, codes: list<list<integer>>>> "
        "(any of the four fields)",
    ),
    S.SPEAKER: _ColumnKind(_is_int_or_text, "string or integer"),
    S.SEED: _ColumnKind(_is_int_or_text, "integer"),
    S.MAX_FRAMES: _ColumnKind(_is_int_or_text, "integer"),
    S.TEMPERATURE: _ColumnKind(_is_number_or_text, "number"),
    S.TOP_P: _ColumnKind(_is_number_or_text, "number"),
    S.TOP_K: _ColumnKind(_is_int_or_text, "integer"),
}


class InputSchemaError(ValueError):
    """The input table cannot be used at all (a required column is missing or has a type no
    row could be read from). Raised before any work starts."""


def check_input_schema(schema: pa.Schema, columns: Mapping[str, str], source: str) -> dict[str, str]:
    """Check `schema` against the column mapping (canonical name -> the table's name).

    Returns {table column -> canonical name} for the columns present, to rename on read.
    Raises InputSchemaError naming every missing or mistyped column."""
    problems = []
    present = {}
    for canonical in S.INPUT_COLUMNS:
        name = columns.get(canonical, canonical)
        index = schema.get_field_index(name)
        if index < 0:
            if canonical in S.REQUIRED_INPUT:
                hint = "" if name == canonical else f" (data.columns.{canonical})"
                problems.append(f"required column '{name}'{hint} is missing")
            continue
        dtype = schema.field(index).type
        if pa.types.is_dictionary(dtype):  # dictionary-encoded: judged (and read) by its values
            dtype = dtype.value_type
        kind = _KINDS[canonical]
        if not (pa.types.is_null(dtype) or kind.accepts(dtype)):
            problems.append(f"column '{name}' has type {dtype}, expected {kind.expected}")
            continue
        present[name] = canonical
    if problems:
        found = ", ".join(schema.names) or "none"
        raise InputSchemaError(f"input {source}: " + "; ".join(problems) + f" (columns found: {found})")
    return present
