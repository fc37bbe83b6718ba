import sys

from specserve.cluster.cli import main

sys.exit(main())
