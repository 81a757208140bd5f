"""`python -m kfray.eval.backends.cuda measure`: the device measurement in a throwaway process
(device.measure_in_subprocess), printed as one JSON line.
`python -m kfray.eval.backends.cuda profile ARTIFACT TASK SHAPE`: one kf_forward call for ncu
(profile.py)."""
import json
import sys

if sys.argv[1:] == ["measure"]:
    from kfray.eval.backends.cuda.device import measure_device

    print(json.dumps(measure_device()))
elif len(sys.argv) == 5 and sys.argv[1] == "profile":
    from kfray.eval.backends.cuda.profile import run_driver

    sys.exit(run_driver(*sys.argv[2:]))
else:
    print("usage: python -m kfray.eval.backends.cuda measure | profile ARTIFACT TASK SHAPE", file=sys.stderr)
    sys.exit(2)
