"""`attn-dispatch devices`: every visible device, its identity keys and which table serves it."""

from __future__ import annotations

import argparse
import json

NAME = "devices"
HELP = "list visible devices, their identity and model/family keys, and which table serves each"
GIB = 2**30


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(NAME, help=HELP, description="For the CPU and every visible GPU: name, "
                                   "architecture, compute units, memory, the card model and family keys "
                                   "tables are shared by, the fingerprint (card + software stack), and the "
                                   "table lookup level that would serve it (exact, model: other stack, "
                                   "family: scaled stand-in, prior: no table; without a table measured on "
                                   "the card, what the dispatcher does instead); for a CPU table, the torch "
                                   "threads it was timed with against this process's (a warning when they "
                                   "differ). Last, whether the C++ fast path is loaded (or why not: "
                                   "`attn-dispatch build-fast-path` builds it).")
    parser.add_argument("--json", action="store_true", help="print JSON instead of text")
    parser.set_defaults(run=run)


def visible_devices() -> list:
    """The CPU, then every CUDA / ROCm device (`torch.device` objects)."""
    import torch

    gpus = [torch.device("cuda", i) for i in range(torch.cuda.device_count())] if torch.cuda.is_available() else []
    return [torch.device("cpu"), *gpus]


def device_record(device) -> dict:
    import torch

    from attn_dispatch.dispatcher.device_ranking import no_table_line
    from attn_dispatch.dispatcher.measuring import measure_from_env
    from attn_dispatch.models import DeviceIdentity, lookup_table
    from attn_dispatch.models.table_summary import threads_line

    identity = DeviceIdentity.detect(device)
    found = lookup_table(identity, warn=False)
    return {"device": str(device), "name": identity.name, "vendor": identity.vendor, "arch": identity.arch,
            "compute_units": identity.compute_units, "memory_gib": round(identity.memory_bytes / GIB, 1),
            "model_key": identity.model_key, "family_key": identity.family_key,
            "software_key": identity.software_key, "fingerprint": identity.key, "gfx906": identity.is_gfx906,
            "table_level": found.level, "table_path": None if found.path is None else str(found.path),
            "table_verdict": None if found.table is None else found.table.verdict,
            "table_guard": None if found.table is None or found.table.guard is None else found.table.guard.describe(),
            "table_timing_threads": None if found.table is None else found.table.provenance.timing_threads,
            "table_threads": None if found.table is None else threads_line(found.table, torch.get_num_threads()),
            "notes": list(found.warnings),
            "no_table": no_table_line(found.level, str(device), measure=measure_from_env())}


LEVEL_WORDS = {
    "exact": "its own table (same card, same software stack)",
    "model": "a table of the same card model on another software stack (may be stale: run `attn-dispatch check`)",
    "family": "a table of another card of its family, times scaled (unmeasured on this card)",
    "prior": "no table: the analytic prior orders the kernels (run `attn-dispatch calibrate` or `attn-dispatch import`)",
}


def run(args: argparse.Namespace) -> int:
    from attn_dispatch.dispatcher import fast_path

    fast = fast_path.status()
    records = [{**device_record(device), "fast_path": fast} for device in visible_devices()]
    if args.json:
        print(json.dumps(records, indent=1))
        return 0
    for r in records:
        print(f"{r['device']}: {r['name']} ({r['vendor'] or '?'}, {r['arch'] or '?'}, {r['compute_units']} compute units, "
              f"{r['memory_gib']} GiB)")
        print(f"  card model: {r['model_key']}    family: {r['family_key']}{'  (gfx906: MI50 / MI60 / Radeon VII)' if r['gfx906'] else ''}")
        print(f"  software: {r['software_key']}")
        print(f"  fingerprint: {r['fingerprint']}")
        print(f"  table: {r['table_level']}: {LEVEL_WORDS.get(r['table_level'], r['table_level'])}")
        if r["table_path"]:
            print(f"    {r['table_path']}")
            unscored = "outside measured buckets: the table's model chooses (not compared with simpler rules: an older table)"
            print(f"    {r['table_guard'] or unscored}")
            if r["table_threads"]:
                print(f"    {r['table_threads']}")
        for note in r["notes"]:
            print(f"    note: {note}")
        if r["no_table"]:
            print(f"    {r['no_table']}")
    print(f"fast path: {fast}")
    return 0
