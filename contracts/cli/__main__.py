import sys

from contracts.cli.smv import main

sys.exit(main())
