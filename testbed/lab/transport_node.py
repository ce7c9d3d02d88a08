"""An RNS transport node from an RNS config dir the lab wrote (``rngrid
transport`` writes its own TCP-only config; lab hops may be UDP). Runs with
the grid's rns 0.9.4 fixes until SIGTERM.

Run: ``python -m testbed.lab.transport_node CONFIG_DIR``.
"""

import sys

from reticulum_grid.node import rnsnet
from testbed.lab.running import serve_until_signalled


def main():
    rnsnet.start(sys.argv[1])
    serve_until_signalled("transport node up")
    rnsnet.stop()


if __name__ == "__main__":
    main()
