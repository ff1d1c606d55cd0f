import sys

from draftwheel.cli import main

sys.exit(main())
