import sys

from topicbus.cli import main

sys.exit(main())
