"""A lab: client, transport nodes and a tower, each in its own network
namespace, joined by shaped links (see profiles.py).

``Lab(root, path)`` builds hosts ``client`` [- ``hop1`` ...] - ``tower`` with
one shaped link per hop of ``PATHS[path]``; every process it starts (relays,
transport nodes, the tower, client commands) runs inside a namespace and is
ended by ``close()``, which then removes the namespaces.

On each hop the relay runs on the side nearer the tower (B) and RNS there
binds to B's loopback, so nothing crosses the hop except through the relay:

- TCP: A's TCPClientInterface -> relay on B's veth address -> B's TCPServerInterface on 127.0.0.1.
- UDP: A's UDPInterface sends to the relay on B's veth address, which hands
  datagrams to B's UDPInterface on 127.0.0.1; B sends back through the relay's
  second port on B's loopback, which hands them to A's veth address.
"""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from reticulum_grid.inference.default_model import DEFAULT_ALIAS, default_model_path
from reticulum_grid.node import rnsnet
from reticulum_grid.node.identity import load_or_create
from reticulum_grid.store.blobstore import BlobStore
from reticulum_grid.node.localgrid import LocalProcess, TowerProcess, trust_local_towers
from testbed.lab.netns import Namespaces
from testbed.lab.profiles import PATHS, profile

ROOT = Path(__file__).resolve().parents[2]
RNS_PORT, RELAY_PORT, RELAY_BACK_PORT = 4242, 5242, 6242


def interface(name, kind, bitrate, **options):
    lines = [f"  [[{name}]]", f"    type = {kind}", "    enabled = Yes", "    ingress_control = No",
             f"    bitrate = {bitrate}"]
    return lines + [f"    {key} = {value}" for key, value in options.items()]


def rns_config(directory, interfaces, transport):
    """Write an RNS config with ``interfaces`` (lists of lines); no AutoInterface."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    head = ["[reticulum]", f"  enable_transport = {'Yes' if transport else 'No'}", "  share_instance = No",
            "  panic_on_interface_error = No", "", "[logging]", "  loglevel = 3", "", "[interfaces]"]
    (directory / "config").write_text("\n".join(head + [line for i in interfaces for line in i]) + "\n")
    return directory


class NsProcess(LocalProcess):
    """A process inside a lab namespace, ready once its log holds ``ready_text``."""

    def __init__(self, lab, ns, directory, name, argv, ready_text):
        super().__init__(directory, name, None)
        self.lab, self.ns, self._argv, self.ready_text = lab, ns, argv, ready_text

    def argv(self):
        return self.lab.ns.argv(self.ns, self._argv)

    def start(self, timeout=60.0):
        env = dict(os.environ, PYTHONUNBUFFERED="1", PYTHONPATH=str(ROOT))
        self.dir.mkdir(parents=True, exist_ok=True)
        self._log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(self.argv(), stdout=self._log, stderr=subprocess.STDOUT, env=env, cwd=ROOT)
        deadline = time.monotonic() + timeout
        while self.ready_text not in self.log():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"{self.name} did not start; see {self.log_path}:\n{self.log()[-2000:]}")
            time.sleep(0.1)
        return self


class NsTower(TowerProcess):
    """A tower process inside a lab namespace with the RNS config the lab wrote."""

    def __init__(self, lab, ns, root, name, models, allow, rns_dir, dataplane="", **sections):
        network = {"rns_config": str(rns_dir), **({"dataplane": dataplane} if dataplane else {})}
        super().__init__(root, name, models, allow=allow, listen=False, network=network, **sections)
        self.lab, self.ns = lab, ns

    def argv(self):
        return self.lab.ns.argv(self.ns, super().argv())

    def start(self, timeout=90.0):
        super().start(timeout)
        deadline = time.monotonic() + timeout
        while " serving " not in self.log():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"tower {self.name} did not start; see {self.log_path}:\n{self.log()[-2000:]}")
            time.sleep(0.1)
        return self


class Lab:
    """Hosts joined by shaped hops. ``client_home`` is the client's home (its
    identity is on the tower's allow-list with ``roles``); ``client_rns`` its
    RNS config dir; ``relays[i]`` the relay of hop i (stats, up/down);
    ``wires[i]`` the (A, B) addresses of hop i. ``ifac``: {"network_name",
    "passphrase"} set on every interface the lab writes (a private grid)."""

    def __init__(self, root, path="lora-fast", seed=1, ifac=None):
        self.root = Path(root)
        self.hops = [profile(name) for name in PATHS[path]]
        self.seed = seed
        self.ifac = rnsnet.ifac_lines(**ifac) if ifac else []
        self.wires = []
        self.ns = Namespaces()
        self.processes = []
        self.relays = []
        self.tower = None
        self.client_home = self.root / "client"
        self.client_identity = load_or_create(self.client_home / "identity").hash.hex()
        trust_local_towers(self.client_home)  # the lab's client trusts the lab's towers
        try:
            self._build()
        except BaseException:
            self.close()
            raise

    def _build(self):
        roles = ["client"] + [f"hop{i}" for i in range(1, len(self.hops))] + ["tower"]
        self.hosts = [self.ns.add(role) for role in roles]
        interfaces = {ns: [] for ns in self.hosts}
        for i, (hop, a, b) in enumerate(zip(self.hops, self.hosts, self.hosts[1:])):
            addr_a, addr_b = self.ns.wire(a, b)
            self.wires.append((addr_a, addr_b))
            relay = ["--listen", f"{addr_b}:{RELAY_PORT}", "--stats", str(self.root / f"hop{i}.json"),
                     "--rate", str(hop.shape.rate_bps), "--delay", str(hop.shape.delay_s), "--jitter",
                     str(hop.shape.jitter_s), "--loss", str(hop.shape.loss), "--mtu", str(hop.shape.mtu),
                     "--seed", str(self.seed + i)] + (["--half-duplex"] if hop.shape.half_duplex else [])
            if hop.mode == "tcp":
                interfaces[a].append(interface(f"hop {i}", "TCPClientInterface", hop.rns_bitrate,
                                               target_host=addr_b, target_port=RELAY_PORT))
                interfaces[b].append(interface(f"hop {i}", "TCPServerInterface", hop.rns_bitrate,
                                               listen_ip="127.0.0.1", listen_port=RNS_PORT + i))
                relay += ["--mode", "tcp", "--target", f"127.0.0.1:{RNS_PORT + i}"]
            else:
                interfaces[a].append(interface(f"hop {i}", "UDPInterface", hop.rns_bitrate, listen_ip=addr_a,
                                               listen_port=RNS_PORT + i, forward_ip=addr_b, forward_port=RELAY_PORT))
                interfaces[b].append(interface(f"hop {i}", "UDPInterface", hop.rns_bitrate, listen_ip="127.0.0.1",
                                               listen_port=RNS_PORT + i, forward_ip="127.0.0.1",
                                               forward_port=RELAY_BACK_PORT))
                relay += ["--mode", "udp", "--target", f"127.0.0.1:{RNS_PORT + i}",
                          "--back-listen", f"127.0.0.1:{RELAY_BACK_PORT}", "--back-target", f"{addr_a}:{RNS_PORT + i}"]
            self.relays.append(self._start(b, f"relay{i}", [sys.executable, "-m", "testbed.lab.shaper", *relay],
                                           "ready"))
        interfaces = {ns: [lines + self.ifac for lines in found] for ns, found in interfaces.items()}
        self.rns_dirs = {ns: rns_config(self.root / "rns" / ns.rsplit("-", 1)[1], interfaces[ns],
                                        transport=ns not in (self.hosts[0], self.hosts[-1]))
                         for ns in self.hosts}
        self.client_rns = self.rns_dirs[self.hosts[0]]
        for ns in self.hosts[1:-1]:
            self._start(ns, ns.rsplit("-", 1)[1], [sys.executable, "-m", "testbed.lab.transport_node",
                                                   str(self.rns_dirs[ns])], "transport node up")

    def _start(self, ns, name, argv, ready_text):
        process = NsProcess(self, ns, self.root / name, name, argv, ready_text)
        self.processes.append(process)
        return process.start()

    def start_tower(self, name="lab-tower", roles=("infer",), models=None, blobs=(), **sections):
        """The tower, in the last namespace, serving the bundled model; ``blobs``:
        (path, alias, kind) put in its store first."""
        models = models if models is not None else {DEFAULT_ALIAS: default_model_path()}
        self.tower = NsTower(self, self.hosts[-1], self.root, name, models, {self.client_identity: list(roles)},
                             self.rns_dirs[self.hosts[-1]], **sections)
        store = BlobStore(self.tower.dir / "blobs")
        for path, alias, kind in blobs:
            store.add_file(path, alias=alias, kind=kind, copy=True)
        self.processes.append(self.tower)
        return self.tower.start()

    def rngrid(self, *args, timeout=120, home=None):
        """Run the rngrid CLI in the client namespace; CompletedProcess."""
        argv = [sys.executable, "-m", "reticulum_grid", "--home", str(home or self.client_home), *args]
        return subprocess.run(self.ns.argv(self.hosts[0], argv), capture_output=True, text=True, timeout=timeout,
                              cwd=ROOT, env=dict(os.environ, PYTHONPATH=str(ROOT)))

    def popen_client(self, argv, **kwargs):
        """A process in the client namespace (the caller ends it)."""
        return subprocess.Popen(self.ns.argv(self.hosts[0], argv), cwd=ROOT,
                                env=dict(os.environ, PYTHONPATH=str(ROOT)), **kwargs)

    def run_client(self, module, *args, timeout):
        """``python -m module`` (a client run: testbed.lab.client_run, voice_run) in the
        client namespace with the lab's client home, RNS config and hop counters, and
        ``args``; killed after ``timeout`` seconds (TimeoutExpired). (returncode, stdout, stderr)."""
        stats = [arg for i in range(len(self.relays)) for arg in ("--stats", str(self.root / f"hop{i}.json"))]
        proc = self.popen_client([sys.executable, "-m", module, "--home", str(self.client_home),
                                  "--rns-config", str(self.client_rns), *stats, *args],
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            out, err = proc.communicate(timeout=timeout)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
        return proc.returncode, out, err

    def hop_stats(self, i):
        """Counters of hop ``i``'s relay (see shaper.Stats)."""
        path = self.root / f"hop{i}.json"
        return json.loads(path.read_text()) if path.exists() else {}

    def set_hop(self, i, up):
        """Take hop ``i`` down (everything sent is lost) or bring it back."""
        self.relays[i].proc.send_signal(signal.SIGUSR2 if up else signal.SIGUSR1)

    def close(self):
        for process in reversed(self.processes):
            process.stop(timeout=10)
        self.processes.clear()
        self.ns.close()
