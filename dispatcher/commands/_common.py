"""What every command shares: `CommandError` (one line, exit 2) and the ``--device`` / ``--devices`` checks."""

from __future__ import annotations

import argparse
import shlex
from pathlib import Path


class CommandError(Exception):
    """A user error: `cli.main` prints ``attn-dispatch COMMAND: error: <message>`` and exits 2."""


def one_line(error: BaseException) -> str:
    """An exception's message on one line (line breaks joined with ``; ``)."""
    text = str(error).strip() or type(error).__name__
    return "; ".join(part.strip() for part in text.splitlines() if part.strip())


def resolve_device(text: str | None):
    """``--device`` -> a `torch.device` this machine has (default ``cuda`` where PyTorch sees a GPU, else ``cpu``); a
    one-line `CommandError` otherwise. A GPU without an index is the current one (``cuda`` -> ``cuda:0``): PyTorch's
    per-device calls (``set_device``, memory caps) need the index."""
    import torch

    if text is None:
        text = "cuda" if torch.cuda.is_available() else "cpu"
    try:
        device = torch.device(text)
    except (RuntimeError, ValueError):
        raise CommandError(f"--device {text!r} is not a torch device: use cpu, or cuda (cuda:1, ...) for a GPU, "
                           "NVIDIA or AMD alike") from None
    if device.type == "cpu":
        return device
    if device.type == "cuda":
        if not torch.cuda.is_available():
            built = (f"built with CUDA {torch.version.cuda}" if torch.version.cuda
                     else f"built with ROCm {torch.version.hip}" if torch.version.hip else "built without CUDA or ROCm")
            raise CommandError(f"--device {text}: this PyTorch ({torch.__version__}, {built}) sees no GPU; "
                               f"use --device cpu, or run on a machine with a GPU and a CUDA/ROCm build of PyTorch")
        count = torch.cuda.device_count()
        if device.index is not None and device.index >= count:
            raise CommandError(f"--device {text}: only {count} GPU(s) visible (cuda:0 .. cuda:{count - 1})")
        return device if device.index is not None else torch.device("cuda", torch.cuda.current_device())
    backend = getattr(torch, device.type, None)
    is_available = getattr(backend, "is_available", None)
    if is_available is None or not is_available():
        raise CommandError(f"--device {text}: this PyTorch ({torch.__version__}) has no {device.type} device; "
                           f"use --device cpu or cuda")
    return device


def check_devices(args: argparse.Namespace) -> None:
    """Validate the command's ``--device`` / ``--devices`` where set (`CommandError`)."""
    if getattr(args, "device", None) is not None:
        resolve_device(args.device)
    for text in (getattr(args, "devices", None) or "").split(","):
        if text.strip():
            resolve_device(text.strip())


def check_folder(path: str, argument: str, command: str) -> None:
    """`path`'s folder must exist (commands create no folders): else a `CommandError` naming `argument` and the fix."""
    folder = Path(path).parent
    if folder.is_dir():
        return
    if folder.exists():
        raise CommandError(f"{argument} {path}: {folder} is not a folder: give {argument} in a folder that exists")
    raise CommandError(f"{argument} {path}: its folder {folder} does not exist ({command} creates no folders): create "
                       f"it first (mkdir -p {shlex.quote(str(folder))}) or give {argument} in a folder that exists")


def what_is_stored(target: Path) -> tuple[object | None, str | None]:
    """The table stored at `target` and its `describe` line; (None, None) where none (an unreadable file is
    described, with no table)."""
    from attn_dispatch.dispatcher.commands.export import describe  # (export imports this module)
    from attn_dispatch.models import TableError, load_table

    if not target.exists():
        return None, None
    try:
        stored = load_table(target)
    except (TableError, OSError) as error:
        return None, f"an unreadable table file ({one_line(error)})"
    return stored, describe(stored)
