"""`python -m kfray.eval.backends.cuda measure`: the device measurement in a throwaway process
(device.measure_in_subprocess), printed as one JSON line."""
import json
import sys

from kfray.eval.backends.cuda.device import measure_device

if sys.argv[1:] == ["measure"]:
    print(json.dumps(measure_device()))
else:
    print("usage: python -m kfray.eval.backends.cuda measure", file=sys.stderr)
    sys.exit(2)
