import sys

from paracube.cli import main

sys.exit(main())
