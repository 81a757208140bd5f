import numpy as np


def reference(args):
    q, k, v = args["q"], args["k"], args["v"]
    hq, s, _ = q.shape
    group = hq // k.shape[0]
    mask = np.triu(np.ones((s, s), dtype=bool), 1)
    o = np.empty_like(q)
    for h in range(hq):
        sc = (q[h] @ k[h // group].T) * np.float32(args["scale"])
        sc[mask] = -np.inf
        sc = np.exp(sc - sc.max(axis=1, keepdims=True))
        o[h] = (sc / sc.sum(axis=1, keepdims=True)) @ v[h // group]
    return {"o": o}
