import sys

from reports.build import main

sys.exit(main())
