"""Starting RNS with a config we wrote ourselves.

RNS's default config enables AutoInterface, which multicasts on every network
card; the grid never starts RNS without writing its config first (or being
pointed at an existing one). Interfaces we write set ``ingress_control = No``:
on rns 0.9.4 ingress control holds announces from newly seen destinations for
minutes, so towers starting together would not be heard (20 towers started at
once: 1 heard after 20 s).

A private grid on a shared medium (a LoRa channel, a public transport node)
sets RNS's interface access codes (IFAC): every interface we write gets the
grid's ``network_name`` and ``passphrase``, so RNS signs each packet with a
key derived from both and drops packets that lack the code: a node without
them hears no announce and cannot open a Link.
"""

import logging
import os
import signal
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import RNS

from links import rnsfix
from links.channel import RADIO_BPS
from reticulum_grid.node.config import ConfigError, parse_hostport

rns_log = logging.getLogger("rngrid.rns")


def config_text(listen: str = "", connect: Iterable[str] = (), transport: bool = False, link_bitrate: float = 0,
                network_name: str = "", passphrase: str = "") -> str:
    """RNS config text: a TCP server on ``listen`` ("host:port" or ""), a TCP
    client per ``connect`` entry, no AutoInterface, no shared instance.
    ``network_name`` / ``passphrase`` (either may be ""): the interfaces' IFAC
    (see above; quoted by RNS's own ConfigObj). Raises ConfigError.
    ``link_bitrate`` (bits/s, 0 = RNS's guess) is the speed RNS is told every
    interface has. On rns 0.9.4 it sets the link MTU (500 bytes at or below
    62.5 kbit/s, no MTU discovery), paces announces a transport node forwards
    to 2 % of it and scales link timeouts; it does NOT limit the rate (a real
    radio does; tests shape links with the network lab in testbed/lab/)."""
    lines = [
        "[reticulum]",
        f"  enable_transport = {'Yes' if transport else 'No'}",
        "  share_instance = No",
        "  panic_on_interface_error = No",
        "",
        "[logging]",
        "  loglevel = 3",
        "",
        "[interfaces]",
    ]
    extra = ([f"    bitrate = {int(link_bitrate)}"] if link_bitrate else []) + ifac_lines(network_name, passphrase)
    if listen:
        host, port = parse_hostport(listen)
        lines += ["  [[rngrid tcp server]]", "    type = TCPServerInterface", "    enabled = Yes",
                  f"    listen_ip = {host}", f"    listen_port = {port}", "    ingress_control = No"] + extra
    for i, target in enumerate(connect):
        host, port = parse_hostport(target)
        lines += [f"  [[rngrid tcp peer {i}]]", "    type = TCPClientInterface", "    enabled = Yes",
                  f"    target_host = {host}", f"    target_port = {port}", "    ingress_control = No"] + extra
    return "\n".join(lines) + "\n"


def ifac_lines(network_name: str = "", passphrase: str = "") -> list[str]:
    """An interface's IFAC options (``network_name``, ``passphrase``) as RNS
    config lines, quoted as RNS's ConfigObj reads them. Raises ConfigError."""
    from RNS.vendor.configobj import ConfigObj

    options = ConfigObj()
    for key, value in (("network_name", network_name), ("passphrase", passphrase)):
        if value:
            if not isinstance(value, str) or not value.isprintable():
                raise ConfigError(f"{key} must be one line of printable text")
            options[key] = value
    try:
        return [f"    {line}" for line in options.write()]
    except Exception as e:  # ConfigObj cannot quote it (holds both kinds of triple quote)
        raise ConfigError(f"network name or passphrase cannot be written to an RNS config: {e}") from None


def check_listen(listen: str) -> None:
    """Raise OSError when nothing may listen on ``listen`` ("host:port"), e.g. a
    tower already runs there; RNS itself would only log it and exit."""
    import socket
    host, port = parse_hostport(listen)
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as RNS's server does
        try:
            probe.bind((host, port))
        except OSError as e:
            raise OSError(f"cannot listen on {listen}: {e.strerror} (is a tower already running there?)") from None




def on_radio() -> bool:
    """True when any running RNS interface is radio-class (see RADIO_BPS): a
    real RNode, or an interface configured with a low ``bitrate``."""
    return any(0 < (getattr(i, "bitrate", 0) or 0) <= RADIO_BPS for i in RNS.Transport.interfaces)


def offline_peers() -> list[str]:
    """"host:port" of the TCP client interfaces that are not connected."""
    return [f"{i.target_ip}:{i.target_port}" for i in RNS.Transport.interfaces
            if hasattr(i, "target_ip") and not i.online]


def write_config(directory: str | os.PathLike[str], **kwargs: Any) -> Path:
    """Write ``directory/config`` (see config_text; readable by this user only:
    it may hold the passphrase) and return the directory."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "config"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(config_text(**kwargs))
    os.chmod(path, 0o600)  # an existing file keeps its mode through O_CREAT
    return directory


def start(configdir: str | os.PathLike[str]) -> RNS.Reticulum:
    """Start this process's RNS instance from ``configdir`` (which must hold a
    config), with the 0.9.4 race fixes applied and RNS logs sent to logging.

    Keeps the process's own SIGINT/SIGTERM handlers (RNS replaces them with
    handlers that hard-exit, which would skip our cancel-on-Ctrl-C)."""
    configdir = Path(configdir)
    if not (configdir / "config").is_file():
        raise FileNotFoundError(f"no RNS config in {configdir}; refusing to let RNS write its default")
    rnsfix.apply()
    previous = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    reticulum = RNS.Reticulum(configdir=str(configdir), logdest=_log)
    RNS.loglevel = RNS.LOG_DEBUG if rns_log.isEnabledFor(logging.DEBUG) else RNS.LOG_WARNING
    for sig, handler in previous.items():
        signal.signal(sig, handler)
    return reticulum


def start_client(directory: Path, connect: list[str] | None, rns_config: str = "", network_name: str = "",
                 passphrase: str = "") -> None:
    """Start a client's RNS instance (unless this process has one): from
    ``rns_config`` (an RNS config dir of the user's), else from a TCP-only
    config written to ``directory`` with the ``connect`` peers and IFAC.
    Raises ConfigError (IFAC with an RNS config of the user's)."""
    if RNS.Reticulum.get_instance() is not None:
        return
    if rns_config and (network_name or passphrase):
        raise ConfigError("a network name or passphrase shapes the RNS config rngrid writes; with an "
                          "RNS config of your own, set them on its interfaces instead")
    start(rns_config or write_config(directory, connect=connect, network_name=network_name, passphrase=passphrase))


def stop() -> None:
    """Save RNS's tables and detach its interfaces (RNS otherwise does this at
    process exit, which is too late when its config dir is temporary)."""
    RNS.Reticulum.exit_handler()


#: RNS errors that are routine for a grid, logged as info (a tower shows them,
#: a client does not): a Link whose client just left sends a keepalive or
#: teardown (the Link times out by itself).
ROUTINE = ("No interfaces could process the outbound packet",
           # A peer that is not up yet: RNS retries; clients report it themselves.
           "could not be established", "Leaving unconnected and retrying")


def _log(line: str) -> None:
    # RNS hands us formatted lines; its level is only in the text.
    if any(text in line for text in ROUTINE):
        rns_log.info(line)
    elif "[Critical]" in line or "[Error]" in line:
        rns_log.error(line)
    elif "[Warning]" in line:
        rns_log.warning(line)
    else:
        rns_log.debug(line)
