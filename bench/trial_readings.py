"""One-off (H100, no tables, 2026-12-06): the measuring's readings (host time, event time, idle queue) against each kernel's loop time, device time behind a sleep and isolated call; run from the repository root with the package installed, writes $OUT/diag_trial.json."""
import json, os, random, statistics, sys, tempfile, time
import torch
import attn_dispatch as ad
from attn_dispatch.dispatcher import measuring
from attn_dispatch.calibration.inputs import make_inputs
from attn_dispatch.calibration.timer import calls_per_sample, time_batch
from attn_dispatch.kernels import Problem
from attn_dispatch.dispatcher.plans import cache_key
from bench.llm_grid import settle_calls

dev = torch.device("cuda")
from attn_dispatch.dispatcher import fast_path
if fast_path.load() is None:
    print("fast path:", fast_path.build(), flush=True)
LOG = []
orig_start = measuring.CudaEventClock.start
def start(self):
    idle = torch.cuda.current_stream(self.device).query()
    ev, t0 = orig_start(self)
    return ev, t0, idle
def stop(self, started):
    begin, t0, idle = started
    end = torch.cuda.Event(enable_timing=True); end.record(torch.cuda.current_stream(self.device))
    return R(time.perf_counter() - t0, (begin, end), idle)
class R(measuring.Reading):
    __slots__ = ("idle",)
    def __init__(self, h, e, idle):
        super().__init__(h, e); self.idle = idle
measuring.CudaEventClock.start = start; measuring.CudaEventClock.stop = stop
def collect(self):
    while self._pending and self._pending[0][1].ready():
        c, r, w, ch = self._pending.pop(0)
        LOG.append([c.name, w, r._host_s, r._events[0].elapsed_time(r._events[1]) / 1e3, r.idle, r._events[1]])
        self._record(c, r.seconds(), w, ch)
measuring.Trial._collect = collect

SHAPES = [  # (Lq, Lk, D, kv_heads, dtype)  L: slower in session 41, W: true win
    (4, 512, 256, 8, "bfloat16", "L"), (32, 512, 256, 8, "bfloat16", "L"), (2, 512, 256, 8, "float16", "L"),
    (64, 512, 256, 32, "bfloat16", "L"), (4, 2048, 128, 8, "bfloat16", "W"), (8, 2048, 64, 8, "bfloat16", "W"),
    (512, 512, 64, 32, "bfloat16", "W"), (16, 2048, 64, 32, "bfloat16", "W"), (1, 512, 64, 8, "bfloat16", "K"),
    (2, 8192, 128, 8, "float16", "W?"), (16, 512, 128, 8, "bfloat16", "?"), (64, 512, 64, 8, "float16", "?")]

def loop_time(f, rounds=7):
    f(); torch.cuda.synchronize()
    t0 = time.perf_counter(); f(); torch.cuda.synchronize(); once = time.perf_counter() - t0
    n = calls_per_sample(once)
    return statistics.median(time_batch(lambda _i: f(), 0, n, dev) for _ in range(rounds))

def behind(f, calls=20):
    """device time per call (queue busy) and host time per call (device behind)."""
    ks, hs = [], []
    for _ in range(5):
        torch.cuda.synchronize(); torch.cuda._sleep(8_000_000)
        evs = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(calls)]
        t0 = time.perf_counter()
        for a, b in evs:
            a.record(); f(); b.record()
        hs.append((time.perf_counter() - t0) / calls)
        torch.cuda.synchronize()
        ks.append(statistics.median(a.elapsed_time(b) / 1e3 for a, b in evs))
    return statistics.median(ks), statistics.median(hs)

def isolated(paths, rounds=10):
    out = {k: [] for k in paths}
    for r in range(rounds):
        order = list(paths); random.Random(r).shuffle(order)
        for k in order:
            torch.cuda.synchronize()
            a = torch.cuda.Event(enable_timing=True); b = torch.cuda.Event(enable_timing=True)
            a.record(); t0 = time.perf_counter(); paths[k](); t1 = time.perf_counter(); b.record()
            torch.cuda.synchronize()
            out[k].append((t1 - t0, a.elapsed_time(b) / 1e3))
    return {k: (statistics.median(x[0] for x in v), statistics.median(x[1] for x in v)) for k, v in out.items()}

forced = {n: ad.Dispatcher(kernels=[n], measure=False) for n in ("sdpa_flash", "sdpa_cudnn", "sdpa_efficient")}
res = []
for (lq, lk, d, kvh, dt, tag) in SHAPES:
    p = Problem(1, 32, kvh, lq, lk, d, d, dt, causal=False, device_type="cuda")
    x = make_inputs(p, dev); q, k, v = x.query, x.key, x.value
    ex = {"enable_gqa": True} if x.enable_gqa else {}
    F = torch.nn.functional.scaled_dot_product_attention
    paths = {"default": lambda: F(q, k, v, **ex)}
    for n, disp in forced.items():
        paths[n] = (lambda disp=disp: disp.fast_attention(q, k, v, **ex))
    row = {"shape": [lq, lk, d, kvh, dt, tag], "paths": {}}
    for n, f in list(paths.items()):
        try:
            f(); f()
        except Exception as e:
            row["paths"][n] = str(e)[:80]; del paths[n]; continue
    for n, f in paths.items():
        row["paths"][n] = {"loop": loop_time(f), "behind": behind(f)}
    iso = isolated(paths)
    for n in paths: row["paths"][n]["iso"] = iso[n]
    trials = []
    for rep in range(2):
        LOG.clear()
        ours = ad.Dispatcher(remember_tunings=False, home=tempfile.mkdtemp())
        call = lambda: ours.fast_attention(q, k, v, **ex)
        skey = cache_key(q, k, v, None, False, x.enable_gqa)
        t0 = time.perf_counter(); call(); torch.cuda.synchronize()
        once = time.perf_counter() - t0
        call(); torch.cuda.synchronize()
        settle_calls(ours, skey, call, 50e-6)
        torch.cuda.synchronize()
        plan = ours._plans.get(skey)
        ends = [l[5] for l in LOG]
        intervals = [None] + [ends[i - 1].elapsed_time(ends[i]) / 1e3 for i in range(1, len(ends))]
        log = [l[:5] + [iv] for l, iv in zip(LOG, intervals)]
        trials.append({"chosen": plan.kernel.name if plan else None, "log": log,
                       "loop": loop_time(call), "note": ours.explain(q, k, v, **ex).notes[:1]})
    row["trials"] = trials
    res.append(row)
    print(json.dumps({"shape": row["shape"], **{n: {kk: (round(vv * 1e6, 1) if isinstance(vv, float) else [round(z * 1e6, 1) for z in vv]) for kk, vv in r.items()} for n, r in row["paths"].items() if isinstance(r, dict)}, "chosen": [t["chosen"] for t in trials], "loop_ours": [round(t["loop"] * 1e6, 1) for t in trials]}), flush=True)
json.dump(res, open(os.environ.get("OUT", "/tmp") + "/diag_trial.json", "w"))
