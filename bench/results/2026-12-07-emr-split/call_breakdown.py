import timeit
import numpy as np, convengine as ce
from convengine import api, devices, select, nan_rule
from convengine.problem import as_array
from convengine.algorithms.blocked import forward as F
from convengine.algorithms.weight_cache import same_bits
ce.set_num_threads(2); ce.set_tuning("off")
x=np.ones((1,2,2,16),np.float32); w=np.ones((16,1,1,16),np.float32)
ce.conv(x,w,layout="NHWC")
key=api._call_key("forward", x, w, True, 1, 0, 1, 1, "NHWC", "auto")
problem, chosen, run = api._resolve_call(key, None, "auto")
wp,_=F.PACKED.get(w, ("forward",2,16), None)
out=run(x,w)
w2=w.copy()
tests={
 "conv": lambda: ce.conv(x,w,layout="NHWC"),
 "wanted": lambda: devices.wanted("auto", x, w),
 "as_array x2": lambda: (as_array(x,"x"), as_array(w,"w")),
 "call_key": lambda: api._call_key("forward", x, w, True, 1, 0, 1, 1, "NHWC", "auto"),
 "resolve_call": lambda: api._resolve_call(key, None, "auto"),
 "settings": lambda: select.settings("forward"),
 "execute": lambda: api._execute(problem, chosen, run, x, w, x.dtype, None),
 "run": lambda: run(x,w),
 "PACKED.get": lambda: F.PACKED.get(w, ("forward",2,16), None),
 "key": lambda: F.PACKED._key(w, ("forward",2,16)),
 "same_bits": lambda: same_bits(w,w2),
 "must_recompute": lambda: nan_rule.must_recompute(problem, chosen, w, out),
 "ascontig x2": lambda: (np.ascontiguousarray(x, dtype=np.float32), np.ascontiguousarray(w, dtype=np.float32)),
}
for k,f in tests.items():
    n=20000
    t=min(timeit.repeat(f, number=n, repeat=5))/n*1e6
    print(f"{k:16s} {t:6.2f} us")
