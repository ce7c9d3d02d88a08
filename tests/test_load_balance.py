"""Eight client processes, three requests each, over two towers: every request
succeeds and both towers serve. (That a busy answer sends a client to another
tower is shown, deterministically, in tests/test_routing.py.)"""

import json
import subprocess
import sys
from collections import Counter
from pathlib import Path

from reticulum_grid.node.identity import load_or_create
from reticulum_grid.node.localgrid import trust_local_towers
from tests.leftovers import end

HERE = Path(__file__).parent


def test_eight_clients_three_requests_two_towers(hub, tmp_path):
    homes = [tmp_path / f"client-{i}" for i in range(8)]
    allow = {load_or_create(h / "identity").hash.hex(): ["infer"] for h in homes}
    towers = [hub.start_tower(f"lb-{n}", allow=allow) for n in ("a", "b")]
    procs, results = [], []
    try:
        for h in homes:
            trust_local_towers(h, follow=False)
            procs.append(subprocess.Popen([sys.executable, str(HERE / "load_client.py"), str(h), "3"]
                                          + [t.address for t in towers],
                                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
        for p in procs:
            out, err = p.communicate(timeout=300)
            assert p.returncode == 0, err[-2000:]
            results += [json.loads(line) for line in out.splitlines()]
    finally:
        end(*procs)
    failed = [r for r in results if not r["ok"]]
    assert len(results) == 24 and not failed, failed
    served = Counter(r["tower"] for r in results)
    print(f"requests per tower: {dict(served)}")
    assert set(served) == {"lb-a", "lb-b"}
