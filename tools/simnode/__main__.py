"""``python tools/simnode ...`` (or ``python -m simnode`` with tools/ on the path): the simulator's command line."""

import os
import sys

if not __package__:
    # Run as a directory: Python put this package's own directory first on sys.path, where its modules
    # (cpu, kernel, pci, ...) would be top-level names; tools/ goes there instead, as for `import simnode`.
    HERE = os.path.dirname(os.path.abspath(__file__))
    sys.path[:] = [path for path in sys.path if os.path.abspath(path or ".") != HERE]
    sys.path.insert(0, os.path.dirname(HERE))

from simnode.cli import main  # noqa: E402  (sys.path is set above)

sys.exit(main())
