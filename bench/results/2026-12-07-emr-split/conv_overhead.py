import time, statistics, sys
import numpy as np
import convengine as ce
from convengine.problem import make_problem
from convengine.algorithms.blocked import forward as F
from convengine.algorithms.weight_cache import same_bits, transient
ce.set_num_threads(2)
rng=np.random.default_rng(0)
layers=[(160,960,7),(960,160,7),(96,576,14),(512,2048,7)]
for cin,cout,hw in layers:
    x=rng.standard_normal((1,hw,hw,cin),dtype=np.float32)
    w=rng.standard_normal((cout,1,1,cin),dtype=np.float32); w2=w.copy()
    p=make_problem("forward",x.shape,w.shape,layout="NHWC",dtype=np.float32)
    nr=F.VEC*F.panel_vectors(cout)
    wp=F.pack_weight(w,2,nr)
    b=F.bind_forward(p,wp)
    fns={"bound":lambda: b(x,None,"none"),
         "bound+cmp":lambda: (same_bits(w,w2), b(x,None,"none")),
         "ce.conv":lambda: ce.conv(x,w,layout="NHWC",algo="blocked"),
         "cmp":lambda: same_bits(w,w2)}
    res={v:[] for v in fns}
    for f in fns.values(): f()
    for r in range(15):
        order=list(fns) if r%2==0 else list(fns)[::-1]
        for v in order:
            f=fns[v]; n=0; t0=time.perf_counter()
            while True:
                f(); n+=1
                t=time.perf_counter()-t0
                if t>0.01: break
            res[v].append(t/n)
    print(f"{cin}->{cout}@{hw} "+" ".join(f"{v}:{statistics.median(res[v])*1e6:.1f}" for v in fns))
