import sys

from llmmon.cli import main

sys.exit(main())
