def reference(args):
    x = args["x"]
    return {"y": x * x}
