"""Which cards a table file was measured on, read from the start of the file without parsing the rest.

A table file is a few hundred KiB to a few MiB (parsing and validating the bundled H200 table takes
a large share of a first call on a CPU), and a device's table lookup looks at every file in the user's and the
bundled folders. Tables are written with their provenance (the cards they were measured on) near
the top (`table_io.table_to_dict`), so the lookup reads the members of the top-level object one by
one from the first `HEAD_BYTES` until it meets ``"provenance"``, and skips a file measured on no
card of the device's model or family without parsing it. Where the head does not say (another
member order, a truncated or odd file), the caller parses the file as before: this only ever
spares a parse, it never decides that a file is valid.
"""

from __future__ import annotations

import json
import os

from attn_dispatch.models.identity import DeviceIdentity

HEAD_BYTES = 64 * 1024
"""Bytes read from the start of a file: a table's members before its provenance are two short
fields, and a provenance (identities, notes, software versions) is a few KiB even for a merged table
of many cards; the whole head is read once and decoded member by member."""

_decoder = json.JSONDecoder()
_SPACE = " \t\n\r"


def head_identities(path: str | os.PathLike) -> tuple[DeviceIdentity, ...] | None:
    """The cards a table file says it was measured on (its identity, then the merged ones), read
    from its first `HEAD_BYTES`; None where the head does not say (the file must be parsed)."""
    try:
        with open(path, "rb") as handle:
            head = handle.read(HEAD_BYTES).decode("utf-8", errors="ignore")
        provenance = _top_level_member(head, "provenance")
        if not isinstance(provenance, dict):
            return None
        cards = [provenance["identity"], *provenance.get("merged_from", [])]
        return tuple(DeviceIdentity.from_dict(card) for card in cards)
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _top_level_member(text: str, wanted: str) -> object | None:
    """The value of member `wanted` of the JSON object `text` starts with, decoding the members
    before it in order; None where it is not among those `text` holds whole."""
    index = _skip_space(text, 0)
    if text[index:index + 1] != "{":
        return None
    index += 1
    while True:
        index = _skip_space(text, index)
        name, index = _decoder.raw_decode(text, index)  # ValueError where the head ends inside it
        index = _skip_space(text, index)
        if not isinstance(name, str) or text[index:index + 1] != ":":
            return None
        value, index = _decoder.raw_decode(text, _skip_space(text, index + 1))
        if name == wanted:
            return value
        index = _skip_space(text, index)
        if text[index:index + 1] != ",":
            return None
        index += 1


def _skip_space(text: str, index: int) -> int:
    while index < len(text) and text[index] in _SPACE:
        index += 1
    return index
