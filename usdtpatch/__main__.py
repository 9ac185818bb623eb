"""`python -m usdtpatch`."""

import sys

from usdtpatch.cli import main

sys.exit(main())
