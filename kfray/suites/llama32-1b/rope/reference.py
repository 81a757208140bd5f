import numpy as np


def _rotate(x, cos, sin):
    half = x.shape[-1] // 2
    c, s = cos[:, None, :], sin[:, None, :]
    a, b = x[..., :half], x[..., half:]
    return np.concatenate([a * c - b * s, b * c + a * s], axis=-1)


def reference(args):
    return {"q_out": _rotate(args["q"], args["cos"], args["sin"]),
            "k_out": _rotate(args["k"], args["cos"], args["sin"])}
