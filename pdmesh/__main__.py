import sys

from pdmesh.cli import main

sys.exit(main())
