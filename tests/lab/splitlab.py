"""A lab for split models: the coordinating tower and a worker on two hosts joined by a shaped link.

Namespaces ``coord`` and ``worker`` share one subnet through a third, where
tests/lab/bridge.py forwards every frame between them with a profile's rate,
one-way delay, jitter and loss, so the towers see each other's real addresses
(their data planes) and everything between them, RNS and the RPC bytes on the
data plane alike, crosses the shaped link. The client and a tower serving the
model whole (``single``, lending nothing) run on the coordinator's host, as a
laptop on the coordinator's LAN would.

``SplitLab(root, profile, model)`` builds it (``draft``: a model the
coordinator names as its split model's draft; ``dataplane``: give both
towers their data-plane addresses, else RPC rides the RNS tunnel);
``run(argv)`` runs a command in the coordinator's namespace; ``close()`` ends
every process and removes the namespaces.
"""

import os
import subprocess
import sys
from pathlib import Path

from reticulum_grid.node.identity import load_or_create
from reticulum_grid.node.localgrid import trust_local_towers
from reticulum_grid.store.blobstore import BlobStore
from tests.lab.netns import Namespaces
from tests.lab.profiles import profile as link_profile
from tests.lab.topology import ROOT, NsProcess, NsTower, interface, rns_config

#: The model's alias on the towers of a split lab.
ALIAS = "lab-split"
RNS_PORT, CLIENT_PORT = 4242, 4243


class SplitLab:
    """``client_home`` / ``client_rns``: the client's home and RNS config (run it
    in the coordinator's namespace, ``run``); ``towers``: {"coord", "worker",
    "single"}; ``bridge``: the link's process (its counters in ``stats_path``)."""

    def __init__(self, root, profile_name, model, lend_mib=200, threads=1, draft=None, dataplane=True):
        self.root = Path(root)
        self.shape = link_profile(profile_name).shape
        self.ns = Namespaces()
        self.processes = []
        self.towers = {}
        self.client_home = self.root / "client"
        client_id = load_or_create(self.client_home / "identity").hash.hex()
        trust_local_towers(self.client_home)
        try:
            self._build(client_id, model, lend_mib, threads, draft, dataplane)
        except BaseException:
            self.close()
            raise

    def _build(self, client_id, model, lend_mib, threads, draft, dataplane):
        coord, link, worker = self.ns.add("coord"), self.ns.add("link"), self.ns.add("worker")
        self.coord_ns = coord
        self.addr_coord, self.addr_worker, if_c, if_w = self.ns.bridged(coord, worker, link)
        self.stats_path = self.root / "link.json"
        shape = self.shape
        self.bridge = self._start(link, "bridge", [sys.executable, "-m", "tests.lab.bridge", "--a", if_c, "--b", if_w,
                                                   "--rate", str(shape.rate_bps), "--delay", str(shape.delay_s),
                                                   "--jitter", str(shape.jitter_s), "--loss", str(shape.loss),
                                                   "--stats", str(self.stats_path)], "ready")
        rns = {
            "coord": rns_config(self.root / "rns" / "coord", [
                interface("towers", "TCPServerInterface", shape.rate_bps or 10**9, listen_ip=self.addr_coord,
                          listen_port=RNS_PORT),
                interface("local", "TCPServerInterface", 10**9, listen_ip="127.0.0.1", listen_port=CLIENT_PORT)],
                transport=True),
            "worker": rns_config(self.root / "rns" / "worker", [
                interface("towers", "TCPClientInterface", shape.rate_bps or 10**9, target_host=self.addr_coord,
                          target_port=RNS_PORT)], transport=False),
            "single": rns_config(self.root / "rns" / "single", [
                interface("local", "TCPClientInterface", 10**9, target_host="127.0.0.1", target_port=CLIENT_PORT)],
                transport=False),
        }
        self.client_rns = rns_config(self.root / "rns" / "client", [
            interface("local", "TCPClientInterface", 10**9, target_host="127.0.0.1", target_port=CLIENT_PORT)],
            transport=False)
        ids = {n: load_or_create(self.root / n / "identity").hash.hex() for n in ("coord", "worker")}
        shard = {"lend_mib": lend_mib, "threads": threads}
        whole = {"path": model, "threads": threads, "parallel": 1}
        # The coordinator holds the model for split plans (and names its draft), loading nothing whole.
        held = {ALIAS: {**whole, "preload": False, **({"draft": "lab-draft"} if draft else {})}}
        specs = {
            "coord": (coord, held, {client_id: ["infer"], ids["worker"]: ["shard"]},
                      self.addr_coord if dataplane else "", shard),
            "worker": (worker, {}, {client_id: ["infer"], ids["coord"]: ["shard"]},
                       self.addr_worker if dataplane else "", shard),
            "single": (coord, {ALIAS: whole}, {client_id: ["infer"]}, "", {"lend_mib": 0}),
        }
        for name in ("coord", "worker", "single"):
            ns, tower_models, allow, dataplane, lend = specs[name]
            tower = NsTower(self, ns, self.root, name, tower_models, allow, rns[name], dataplane=dataplane, shard=lend)
            if name == "coord" and draft:
                BlobStore(tower.dir / "blobs").add_file(draft, alias="lab-draft", kind="model")
            self.processes.append(tower)
            self.towers[name] = tower.start()

    def _start(self, ns, name, argv, ready_text):
        process = NsProcess(self, ns, self.root / name, name, argv, ready_text)
        self.processes.append(process)
        return process.start()

    def run(self, argv, timeout=900):
        """``argv`` in the coordinator's namespace (the client's host): CompletedProcess."""
        return subprocess.run(self.ns.argv(self.coord_ns, argv), capture_output=True, text=True, timeout=timeout,
                              cwd=ROOT, env=dict(os.environ, PYTHONPATH=str(ROOT)))

    def close(self):
        for process in reversed(self.processes):
            process.stop(timeout=10)
        self.ns.close()
