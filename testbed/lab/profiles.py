"""Named link profiles for the network lab.

| profile   | carried as | rate        | one-way delay | jitter | loss  | MTU   | air         |
|-----------|------------|-------------|---------------|--------|-------|-------|-------------|
| lan       | TCP        | 1 Gbit/s    | 0.25 ms (0.5 ms RTT) | 0.02 ms | 0 | 1500 | full duplex |
| tailnet   | TCP        | 100 Mbit/s  | 20 ms (40 ms RTT) | 2 ms | 0.1 % | 1280 | full duplex |
| lora-fast | UDP        | 5.5 kbit/s  | 250 ms        | 25 ms  | 1 %   | 500   | half duplex |
| lora-long | UDP        | 1.2 kbit/s  | 1 s           | 100 ms | 3 %   | 500   | half duplex |

LoRa links are carried as UDP datagrams (RNS UDPInterface), so a lost packet
is lost, as on a radio, and RNS's own retransmission (Channel, Resource) has
to cope; both directions share one air (a radio sends or receives). A tailnet
is TCP (RNS TCPInterface over WireGuard), so loss only costs a retransmission.
``two-hop`` is a path client - transport node - tower whose first hop is a
tailnet and whose second (the transport node's radio) is lora-fast. ``lan``
is what two towers in one house see; testbed/lab/splitlab.py joins a split
model's coordinator and worker with one of these.

``rns_bitrate`` is what the RNS interface on that link is told its speed is:
RNS uses it for link timeouts, the announce cap (2 % of it) and, on TCP
interfaces, the link MTU.
"""

from dataclasses import dataclass

from testbed.lab.shaper import Shape


@dataclass(frozen=True)
class Profile:
    name: str
    mode: str          # "tcp" or "udp"
    shape: Shape
    rns_bitrate: int   # bit/s, as told to RNS

    def payload_airtime(self, nbytes):
        """Seconds ``nbytes`` take on this link's air."""
        return self.shape.airtime(nbytes)


PROFILES = {
    "lan": Profile("lan", "tcp", Shape(1_000_000_000, 0.00025, 0.00002, 0.0, 1500), 1_000_000_000),
    "tailnet": Profile("tailnet", "tcp", Shape(100_000_000, 0.020, 0.002, 0.001, 1280), 100_000_000),
    "lora-fast": Profile("lora-fast", "udp", Shape(5_500, 0.250, 0.025, 0.01, 500, half_duplex=True), 5_500),
    "lora-long": Profile("lora-long", "udp", Shape(1_200, 1.0, 0.1, 0.03, 500, half_duplex=True), 1_200),
}

#: Paths of several hops: hop profiles from the client towards the tower.
PATHS = {
    "lan": ("lan",),
    "tailnet": ("tailnet",),
    "lora-fast": ("lora-fast",),
    "lora-long": ("lora-long",),
    "two-hop": ("tailnet", "lora-fast"),
}


def profile(name):
    try:
        return PROFILES[name]
    except KeyError:
        raise ValueError(f"unknown link profile {name!r}; known: {', '.join(PROFILES)}") from None
