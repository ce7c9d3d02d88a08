"""A lab for split models: the coordinating tower and its workers on hosts joined by shaped links.

Namespaces ``coord`` and ``worker`` (with two workers ``worker`` and
``worker2``) share one subnet through another, where testbed/lab/bridge.py
forwards every frame between them with a profile's rate, one-way delay,
jitter and loss (each pair of hosts a link of its own), so the towers see
each other's real addresses (their data planes) and everything between them,
RNS and the RPC bytes on the data plane alike, crosses a shaped link. The client and a tower serving the
model whole (``single``, lending nothing) run on the coordinator's host, as a
laptop on the coordinator's LAN would.

``SplitLab(root, profile, model)`` builds it (``lends``: MiB the coordinator
and each worker lend, one worker per lend after the first, default
``lend_mib`` for a coordinator and one worker; ``draft``: a model the
coordinator names as its split model's draft; ``dataplane``: give the
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
from testbed.lab.netns import Namespaces
from testbed.lab.profiles import profile as link_profile
from testbed.lab.topology import ROOT, NsProcess, NsTower, interface, rns_config

#: The model's alias on the towers of a split lab.
ALIAS = "lab-split"
RNS_PORT, CLIENT_PORT = 4242, 4243


class SplitLab:
    """``client_home`` / ``client_rns``: the client's home and RNS config (run it
    in the coordinator's namespace, ``run``); ``towers``: {"coord", "worker",
    ["worker2",] "single"}; ``bridge``: the links' process (its counters in ``stats_path``)."""

    def __init__(self, root, profile_name, model, lend_mib=200, threads=1, draft=None, dataplane=True, lends=None):
        self.root = Path(root)
        self.shape = link_profile(profile_name).shape
        self.ns = Namespaces()
        self.processes = []
        self.towers = {}
        self.client_home = self.root / "client"
        client_id = load_or_create(self.client_home / "identity").hash.hex()
        trust_local_towers(self.client_home)
        try:
            self._build(client_id, model, tuple(lends or (lend_mib, lend_mib)), threads, draft, dataplane)
        except BaseException:
            self.close()
            raise

    def _build(self, client_id, model, lends, threads, draft, dataplane):
        lenders = ["coord", *(f"worker{i + 1 if i else ''}" for i in range(len(lends) - 1))]
        spaces = {name: self.ns.add(name) for name in lenders}
        link = self.ns.add("link")
        coord = self.coord_ns = spaces["coord"]
        addresses, ends = self.ns.bridged([spaces[n] for n in lenders], link)
        address = dict(zip(lenders, addresses))
        self.addr_coord, self.addr_worker = address["coord"], address["worker"]
        self.stats_path = self.root / "link.json"
        shape = self.shape
        sides = [arg for flag, end in zip(("--a", "--b", "--c"), ends) for arg in (flag, end)]
        self.bridge = self._start(link, "bridge", [sys.executable, "-m", "testbed.lab.bridge", *sides,
                                                   "--rate", str(shape.rate_bps), "--delay", str(shape.delay_s),
                                                   "--jitter", str(shape.jitter_s), "--loss", str(shape.loss),
                                                   "--stats", str(self.stats_path)], "ready")
        rns = {
            "coord": rns_config(self.root / "rns" / "coord", [
                interface("towers", "TCPServerInterface", shape.rate_bps or 10**9, listen_ip=self.addr_coord,
                          listen_port=RNS_PORT),
                interface("local", "TCPServerInterface", 10**9, listen_ip="127.0.0.1", listen_port=CLIENT_PORT)],
                transport=True),
            "single": rns_config(self.root / "rns" / "single", [
                interface("local", "TCPClientInterface", 10**9, target_host="127.0.0.1", target_port=CLIENT_PORT)],
                transport=False),
        }
        for name in lenders[1:]:
            rns[name] = rns_config(self.root / "rns" / name, [
                interface("towers", "TCPClientInterface", shape.rate_bps or 10**9, target_host=self.addr_coord,
                          target_port=RNS_PORT)], transport=False)
        self.client_rns = rns_config(self.root / "rns" / "client", [
            interface("local", "TCPClientInterface", 10**9, target_host="127.0.0.1", target_port=CLIENT_PORT)],
            transport=False)
        ids = {n: load_or_create(self.root / n / "identity").hash.hex() for n in lenders}
        whole = {"path": model, "threads": threads, "parallel": 1}
        # The coordinator holds the model for split plans (and names its draft), loading nothing whole.
        held = {ALIAS: {**whole, "preload": False, **({"draft": "lab-draft"} if draft else {})}}
        specs = {name: (spaces[name], held if name == "coord" else {},
                        {client_id: ["infer"], **{ids[o]: ["shard"] for o in lenders if o != name}},
                        address[name] if dataplane else "", {"lend_mib": mib, "threads": threads})
                 for name, mib in zip(lenders, lends)}
        specs["single"] = (coord, {ALIAS: whole}, {client_id: ["infer"]}, "", {"lend_mib": 0})
        for name in [*lenders, "single"]:
            ns, tower_models, allow, plane, lend = specs[name]
            tower = NsTower(self, ns, self.root, name, tower_models, allow, rns[name], dataplane=plane, shard=lend)
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
