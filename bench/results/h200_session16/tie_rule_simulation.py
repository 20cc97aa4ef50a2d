"""Session 16: the measured-entry tie rule "lowest upper bound among tied kernels" against the shipped
one ("more samples, then the lower median"), priced with each file's recorded medians where the table path
chose the entry's winner. Tried, not adopted (docs/RESULTS.md section 22).

    python bench/results/h200_session16/tie_rule_simulation.py GRID.jsonl [MORE.jsonl ...]
"""
import gzip, json, math, sys
from attn_dispatch.models.table import ThresholdTable
from attn_dispatch.models.measured import pick, DEFAULT_KERNEL
from attn_dispatch.kernels import Problem
t=ThresholdTable.from_dict(json.load(open('models/tables/nvidia-h200-140gb.json')))
def pick_new(times):
    fastest=min(times,key=lambda x:(x.median_s,x.kernel))
    tied=[x for x in times if x.overlaps(fastest)]
    if any(x.kernel==DEFAULT_KERNEL for x in tied): return DEFAULT_KERNEL
    return min(tied,key=lambda x:(x.high_s,x.median_s,x.kernel)).kernel
for f in sys.argv[1:]:
    rows=[json.loads(l) for l in (gzip.open(f,"rt") if f.endswith(".gz") else open(f))][1:]
    old=[];new=[];changed=[]
    for r in rows:
        p=dict(r["problem"]); p["mask_shape"]=tuple(p["mask_shape"]); prob=Problem(**p)
        paths=r["paths"]
        def g(k):
            v=paths.get("pytorch" if k=="sdpa_default" else "kernel:"+k); return v and v.get("median_s")
        ks={k[7:]:v["median_s"] for k,v in paths.items() if k.startswith("kernel:") and v.get("median_s")}
        ks["sdpa_default"]=paths["pytorch"]["median_s"]
        best=min(ks.values())
        tab=paths.get("table",{}).get("median_s")
        if not tab: continue
        e=t.measured_entry(prob)
        a=b=tab
        if e is not None and r["chosen"]["table"]==e.winner:
            w2=pick_new(e.times)
            if w2!=e.winner and g(w2):
                b=g(w2)*tab/g(e.winner) if g(e.winner) else g(w2)
                changed.append((e.winner,w2,round(tab/best,2),round(b/best,2)))
        old.append(a/best);new.append(b/best)
    gm=lambda v: math.exp(sum(map(math.log,v))/len(v))
    print(f, len(old), "old %.3f worst %.2f | new %.3f worst %.2f | changed %d"%(gm(old),max(old),gm(new),max(new),len(changed)))
    for c in changed: print("  ",c)
