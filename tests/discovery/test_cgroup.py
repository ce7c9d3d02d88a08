"""node/cgroup.py on trees laid out as the kernel shows them (man 7 cgroups):
/proc/<pid>/cgroup and the v1 and v2 memory files, written by the test."""

from reticulum_grid.node.cgroup import MemoryLimit, memory_limit

MIB = 1 << 20


def tree(tmp_path, cgroup_lines, files):
    proc, root = tmp_path / "proc", tmp_path / "cgroup"
    (proc / "self").mkdir(parents=True)
    (proc / "self" / "cgroup").write_text("\n".join(cgroup_lines) + "\n")
    for path, text in files.items():
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_text(text)
    return {"proc": proc, "root": root}


def test_v2_limit_less_the_reclaimable_cache(tmp_path):
    where = tree(tmp_path, ["0::/docker/abc"], {
        "docker/abc/memory.max": f"{512 * MIB}\n", "docker/abc/memory.current": f"{200 * MIB}\n",
        "docker/abc/memory.stat": f"anon {100 * MIB}\ninactive_file {50 * MIB}\n", "docker/memory.max": "max\n"})
    assert memory_limit(**where) == MemoryLimit(512 * MIB, 150 * MIB)
    assert memory_limit(**where).free == 362 * MIB


def test_a_tighter_parent_limit_holds(tmp_path):
    where = tree(tmp_path, ["0::/slice/job"], {
        "slice/job/memory.max": "max\n", "slice/job/memory.current": f"{10 * MIB}\n",
        "slice/memory.max": f"{300 * MIB}\n", "slice/memory.current": f"{100 * MIB}\n"})
    assert memory_limit(**where) == MemoryLimit(300 * MIB, 100 * MIB)


def test_v1_memory_controller(tmp_path):
    unlimited = str(9223372036854771712)
    where = tree(tmp_path, ["9:name=systemd:/", "4:memory:/process_api/x", "1:cpu,cpuacct:/"], {
        "memory/process_api/x/memory.limit_in_bytes": f"{256 * MIB}\n",
        "memory/process_api/x/memory.usage_in_bytes": f"{120 * MIB}\n",
        "memory/process_api/x/memory.stat": f"cache {60 * MIB}\ntotal_inactive_file {20 * MIB}\n",
        "memory/process_api/memory.limit_in_bytes": unlimited, "memory/memory.limit_in_bytes": unlimited})
    assert memory_limit(**where) == MemoryLimit(256 * MIB, 100 * MIB)


def test_no_limit_anywhere_is_none(tmp_path):
    unlimited = str(9223372036854771712)
    assert memory_limit(**tree(tmp_path, ["4:memory:/a"], {"memory/a/memory.limit_in_bytes": unlimited,
                                                         "memory/a/memory.usage_in_bytes": "5"})) is None
    assert memory_limit(**tree(tmp_path / "v2", ["0::/"], {"memory.max": "max"})) is None
    assert memory_limit(proc=tmp_path / "nowhere", root=tmp_path / "nowhere") is None


def test_unreadable_usage_is_skipped_not_guessed(tmp_path):
    where = tree(tmp_path, ["0::/g"], {"g/memory.max": f"{64 * MIB}\n"})
    assert memory_limit(**where) is None
