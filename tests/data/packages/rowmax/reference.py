import numpy as np


def reference(args):
    return {"m": np.max(args["x"], axis=1)}
