def reference(args):
    return {"y": args["alpha"] * args["x"]}
