"""What a node with a given RNS config gets from a tower: its announce, and a Link.

Run (in a lab namespace): ``python -m testbed.lab.ifac_probe --rns-config DIR
--tower-identity FILE [--wait S]``. It sends a discovery ping, waits up to
``--wait`` seconds for the tower's announce, then tries a Link to the tower's
destination (known from its identity, as an outsider who learnt the identity
hash and key elsewhere would; with no path RNS sends the link request out on
every interface) for as long again. Prints one JSON line:
``{"heard": bool, "link": bool}``.
"""

import argparse
import json
import threading
import time

import RNS

from announce.announcer import APP_NAME, TOWER_ASPECT, Pinger
from reticulum_grid.node import rnsnet


class Heard:
    aspect_filter = f"{APP_NAME}.{TOWER_ASPECT}"
    receive_path_responses = True

    def __init__(self):
        self.event = threading.Event()

    def received_announce(self, destination_hash, announced_identity, app_data):
        self.event.set()


def main():
    parser = argparse.ArgumentParser(prog="ifac_probe")
    parser.add_argument("--rns-config", required=True)
    parser.add_argument("--tower-identity", required=True)
    parser.add_argument("--wait", type=float, default=15.0)
    args = parser.parse_args()
    rnsnet.start(args.rns_config)
    heard = Heard()
    RNS.Transport.register_announce_handler(heard)
    time.sleep(1.0)  # the TCP interface connects
    Pinger(RNS.Identity()).ping()
    got_announce = heard.event.wait(args.wait)
    tower = RNS.Identity.from_file(args.tower_identity)
    destination = RNS.Destination(tower, RNS.Destination.OUT, RNS.Destination.SINGLE, APP_NAME, TOWER_ASPECT)
    established = threading.Event()
    RNS.Link(destination, established_callback=lambda link: established.set())
    got_link = established.wait(args.wait)
    print(json.dumps({"heard": got_announce, "link": got_link}), flush=True)
    rnsnet.stop()


if __name__ == "__main__":
    main()
