"""`python -m tfgen.beam ...`: the Beam pipeline of `tfgen.beam.pipeline`."""

import sys

from tfgen.beam.pipeline import main

sys.exit(main())
