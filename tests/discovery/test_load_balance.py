"""Eight client processes, three requests each, over two towers: every request
succeeds and both towers serve. (That a busy answer sends a client to another
tower is shown, deterministically, in tests/discovery/test_routing.py.)"""

from collections import Counter

from reticulum_grid.inference.default_model import DEFAULT_ALIAS
from reticulum_grid.node.identity import load_or_create
from reticulum_grid.node.localgrid import trust_local_towers
from tests.client_process import ClientProcess


def test_eight_clients_three_requests_two_towers(hub, tmp_path):
    homes = [tmp_path / f"client-{i}" for i in range(8)]
    allow = {load_or_create(h / "identity").hash.hex(): ["infer"] for h in homes}
    towers = [hub.start_tower(f"lb-{n}", allow=allow) for n in ("a", "b")]
    clients = []
    try:
        for h in homes:
            trust_local_towers(h, follow=False)
            clients.append(ClientProcess(h, [t.address for t in towers]))
        for i in range(3):  # each client's three requests go one after another; the eight clients at once
            for client in clients:
                client.ask({"model": DEFAULT_ALIAS, "max_tokens": 24, "prompt": f"Request {i}: list three colours:"},
                           wait_towers=2)
        results = [client.result(300) for client in clients for _ in range(3)]
    finally:
        for client in clients:
            client.close()
        hub.stop_towers(towers)
    failed = [r for r in results if r.error or not r.usage]
    assert len(results) == 24 and not failed, failed
    served = Counter(r.usage["tower"] for r in results)
    print(f"requests per tower: {dict(served)}")
    assert set(served) == {"lb-a", "lb-b"}
