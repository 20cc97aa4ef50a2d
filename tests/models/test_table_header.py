"""A table file's cards read from its head (`models.sharing`), and the lookup that parses no
file measured on another card (`models.sharing.lookup_table`)."""

from __future__ import annotations

import json
from pathlib import Path

from attn_dispatch.models import sharing
from attn_dispatch.models.identity import DeviceIdentity
from attn_dispatch.models.sharing import head_identities, lookup_table, store_table
from attn_dispatch.models.table_io import table_to_dict
from tests.models.conftest import fake_identity

BUNDLED_H200 = Path(sharing.BUNDLED_TABLES_DIR) / "nvidia-h200-140gb.json"


def test_the_bundled_tables_head_names_its_card():
    (card,) = head_identities(BUNDLED_H200)
    assert card.name == "NVIDIA H200" and card.arch == "sm_90"


def test_a_head_that_does_not_say_leaves_the_file_to_be_parsed(tmp_path, mi50_table):
    data = table_to_dict(mi50_table)
    reordered = {"classes": data["classes"], **{k: v for k, v in data.items() if k != "classes"}}
    big_first = tmp_path / "big_first.json"
    big_first.write_text(json.dumps({"padding": "x" * 100_000, **reordered}))
    assert head_identities(big_first) is None  # the provenance is past the head
    small_first = tmp_path / "reordered.json"
    small_first.write_text(json.dumps(reordered))
    assert head_identities(small_first) in (None, (mi50_table.identity,))
    for text in ("", "[1, 2]", '{"provenance": 3}', '{"provenance": {"identity": {"name": "x"}}}', '{"a": 1 "b"'):
        (tmp_path / "odd.json").write_text(text)
        assert head_identities(tmp_path / "odd.json") is None
    assert head_identities(tmp_path / "missing.json") is None


def test_the_lookup_parses_no_file_of_another_card(tmp_path, monkeypatch, mi50_table):
    parsed = []
    real = sharing._load_unchanged
    monkeypatch.setattr(sharing, "_load_unchanged", lambda path: parsed.append(path.name) or real(path))
    monkeypatch.setattr(sharing, "BUNDLED_TABLES_DIR", BUNDLED_H200.parent)
    home = tmp_path / "home"
    stored = store_table(mi50_table, home=home)
    found = lookup_table(DeviceIdentity.cpu(), home=home, warn=False)
    assert found.level == "prior" and parsed == []  # neither the MI50's nor the bundled H200's
    found = lookup_table(fake_identity("mi50_32"), home=home, warn=False)
    assert found.level == "exact" and parsed == [stored.name]
    parsed.clear()
    found = lookup_table(fake_identity("h200"), home=home, warn=False)
    assert found.path == BUNDLED_H200 and parsed == [BUNDLED_H200.name]
