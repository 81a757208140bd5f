import sys

from kfray.sweep.cli import main

sys.exit(main())
