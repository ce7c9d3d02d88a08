"""Separate hosts on one machine: network namespaces joined by veth pairs.

Every namespace and address the lab uses is made here and removed by
``Namespaces.close()``; names carry the process id and a random part, so
concurrent runs never clash. Addresses come from LAB_NET, a private /24 that
exists only inside these namespaces (each veth pair or bridged link gets a
/29 of it; the same addresses in another run's namespaces are separate networks).
"""

import ipaddress
import os
import secrets
import shutil
import subprocess

#: The lab's private /24; it never leaves the namespaces the lab creates.
LAB_NET = ipaddress.ip_network("10.247.91.0/24")


class LabUnavailable(RuntimeError):
    """Network namespaces cannot be made here (not root, no ``ip``, refused by the kernel)."""


def _ip(*args, check=True):
    result = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=20)
    if check and result.returncode != 0:
        raise LabUnavailable(f"ip {' '.join(args)}: {result.stderr.strip() or result.returncode}")
    return result


def _ethtool(ns, ifname):
    """No offloads on ``ifname`` in ``ns``: frames leave whole, checksummed and one MTU long."""
    done = subprocess.run(["ip", "netns", "exec", ns, "ethtool", "-K", ifname, "tx", "off", "rx", "off", "tso", "off",
                           "gso", "off", "gro", "off"], capture_output=True, text=True, timeout=20)
    if done.returncode != 0:
        raise LabUnavailable(f"ethtool -K {ifname}: {done.stderr.strip() or done.returncode}")


def unavailable_reason():
    """Why the lab cannot run here (a sentence), or None when it can."""
    if shutil.which("ip") is None:
        return "the `ip` command (iproute2) is not installed"
    if shutil.which("ethtool") is None:
        return "the `ethtool` command is not installed"
    if os.geteuid() != 0:
        return "network namespaces need root"
    probe = Namespaces()
    try:
        probe.add("probe")
    except LabUnavailable as e:
        return f"network namespaces are refused here: {e}"
    finally:
        probe.close()
    return None


class Namespaces:
    """Namespaces and veth pairs of one lab, all removed by ``close()``."""

    def __init__(self):
        self.prefix = f"rglab{os.getpid():x}{secrets.token_hex(2)}"
        self.names = []
        self._subnets = LAB_NET.subnets(new_prefix=29)

    def add(self, role):
        """A new namespace for ``role`` with its loopback up; returns its name."""
        name = f"{self.prefix}-{role}"
        _ip("netns", "add", name)
        self.names.append(name)
        _ip("-n", name, "link", "set", "lo", "up")
        return name

    def wire(self, a, b):
        """A veth pair between namespaces ``a`` and ``b``; returns their addresses
        (strings). The pair is created inside the namespaces, never in ours."""
        net = next(self._subnets)
        addr_a, addr_b = (str(h) for h in list(net.hosts())[:2])
        ifname_a, ifname_b = f"to{self.names.index(b)}", f"to{self.names.index(a)}"
        _ip("link", "add", ifname_a, "netns", a, "type", "veth", "peer", "name", ifname_b, "netns", b)
        for ns, ifname, addr in ((a, ifname_a, addr_a), (b, ifname_b, addr_b)):
            _ip("-n", ns, "addr", "add", f"{addr}/{net.prefixlen}", "dev", ifname)
            _ip("-n", ns, "link", "set", ifname, "up")
        return addr_a, addr_b

    def bridged(self, hosts, bridge_ns):
        """Namespaces ``hosts`` (two to six) on one subnet through ``bridge_ns``
        (where testbed/lab/bridge.py forwards frames between its veths): returns
        (each host's address, the bridge's interface to each host), in the
        order of ``hosts``. The hosts' veths send segments of one MTU with their
        checksums filled in (no offloaded large segments or checksums: ethtool),
        so every frame the bridge sees is one the link would carry."""
        net = next(self._subnets)
        addresses = [str(h) for h in list(net.hosts())[:len(hosts)]]
        if len(addresses) < len(hosts):
            raise ValueError(f"a bridged link holds {len(addresses)} hosts at most")
        ends = []
        for host, addr in zip(hosts, addresses):
            host_if, bridge_if = f"br{self.names.index(bridge_ns)}", f"to{self.names.index(host)}"
            _ip("link", "add", host_if, "netns", host, "type", "veth", "peer", "name", bridge_if, "netns", bridge_ns)
            _ip("-n", host, "addr", "add", f"{addr}/{net.prefixlen}", "dev", host_if)
            for ns, ifname in ((host, host_if), (bridge_ns, bridge_if)):
                _ethtool(ns, ifname)
                _ip("-n", ns, "link", "set", ifname, "up")
            ends.append(bridge_if)
        return addresses, ends

    def argv(self, ns, argv):
        """``argv`` run inside namespace ``ns`` (``ip netns exec`` execs it, so
        the process id is the command's own)."""
        return ["ip", "netns", "exec", ns, *argv]

    def close(self):
        """Remove every namespace (their veth pairs go with them)."""
        for name in reversed(self.names):
            _ip("netns", "del", name, check=False)
        self.names.clear()
