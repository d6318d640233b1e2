import sys

from llamacpp_mla_port.cli import main

sys.exit(main())
