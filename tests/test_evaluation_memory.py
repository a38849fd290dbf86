"""evaluation.memory: freed heap pages go back to the operating system on glibc."""
import json
import platform
import subprocess
import sys
from pathlib import Path

MODULE = Path(__file__).resolve().parents[1] / "timm_csm" / "evaluation" / "memory.py"

# A fresh interpreter with nothing but the module, so the heap starts small and predictable: 1 024 blocks of 64 KiB
# (below glibc's mmap threshold, so from the heap), each followed by a small block that stays allocated. Freed, the
# big blocks lie between live ones, where the heap cannot shrink by itself.
SCENARIO = """
import ctypes, importlib.util, json, os, sys
spec = importlib.util.spec_from_file_location("memory", sys.argv[1])
memory = importlib.util.module_from_spec(spec)
spec.loader.exec_module(memory)
def resident():  # Linux only; glibc is only checked there
    if not os.path.exists("/proc/self/statm"):
        return -1
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
libc = ctypes.CDLL(None)
libc.malloc.restype, libc.malloc.argtypes, libc.free.argtypes = ctypes.c_void_p, [ctypes.c_size_t], [ctypes.c_void_p]
big, small = [], []
for _ in range(1024):
    big.append(libc.malloc(65536))
    ctypes.memset(big[-1], 1, 65536)  # resident
    small.append(libc.malloc(64))
for block in big:
    libc.free(block)
freed = resident()
released = memory.release_freed_memory()
print(json.dumps({"released": released, "freed": freed, "after": resident()}))
"""


def test_freed_heap_pages_are_returned_on_glibc():
    out = subprocess.run([sys.executable, "-c", SCENARIO, str(MODULE)], capture_output=True, text=True, check=True)
    result = json.loads(out.stdout)
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        assert result["released"] is False
        return
    assert result["released"] is True
    # most of the 64 MiB freed comes back
    assert result["freed"] - result["after"] > 32 * 2 ** 20, result
