def reference(args):
    return {"y": args["w"] @ args["x"]}
