import sys

from tidewater.tools.cli import main

sys.exit(main())
