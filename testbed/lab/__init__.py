"""The network lab: separate hosts (network namespaces) joined by shaped links
(a user-space relay: rate, delay, jitter, loss, MTU), with named profiles
(tailnet, lora-fast, lora-long, two-hop). Test tooling, not part of the product."""
