"""The per-user cache directory and its sub-directories."""

from __future__ import annotations

from attn_dispatch.models import paths
from attn_dispatch.models.environment import HOME


def test_env_override_and_subdirectories(tmp_path, monkeypatch):
    monkeypatch.setenv(HOME.name, str(tmp_path / "home"))
    assert paths.home() == tmp_path / "home"
    for make, name in ((paths.tables_dir, "tables"), (paths.journals_dir, "journals")):
        directory = make()
        assert directory == tmp_path / "home" / name and directory.is_dir()


def test_explicit_override_beats_env(tmp_path, monkeypatch):
    monkeypatch.setenv(HOME.name, str(tmp_path / "env"))
    assert paths.tables_dir(tmp_path / "mine") == tmp_path / "mine" / "tables"


def test_platform_default(tmp_path, monkeypatch):
    import platformdirs

    asked = []
    monkeypatch.delenv(HOME.name, raising=False)
    monkeypatch.setattr(platformdirs, "user_cache_dir", lambda name: asked.append(name) or str(tmp_path / name))
    assert paths.home() == tmp_path / "attn-dispatch" and asked == ["attn-dispatch"]
