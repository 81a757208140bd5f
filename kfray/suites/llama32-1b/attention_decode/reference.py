import numpy as np


def reference(args):
    q, k, v = args["q"], args["k_cache"], args["v_cache"]
    group = q.shape[0] // k.shape[0]
    kk = np.repeat(k, group, axis=0)                   # q_heads x kv_len x d
    vv = np.repeat(v, group, axis=0)
    sc = np.einsum("hd,hjd->hj", q, kk) * np.float32(args["scale"])
    sc = np.exp(sc - sc.max(axis=1, keepdims=True))
    p = sc / sc.sum(axis=1, keepdims=True)
    return {"o": np.einsum("hj,hjd->hd", p, vv)}
