"""What `import` and `merge` check before they store a table where the dispatcher's lookup finds
it: what is stored at that place already."""

from __future__ import annotations

from pathlib import Path

from attn_dispatch.dispatcher.commands._common import one_line
from attn_dispatch.dispatcher.commands.export import describe


def what_is_stored(target: Path) -> tuple[object | None, str | None]:
    """The table stored at `target` and its `describe` line; (None, None) where there is none. An
    unreadable file there is described as such, with no table: replacing it loses something too."""
    from attn_dispatch.models import TableError, load_table

    if not target.exists():
        return None, None
    try:
        stored = load_table(target)
    except (TableError, OSError) as error:
        return None, f"an unreadable table file ({one_line(error)})"
    return stored, describe(stored)
