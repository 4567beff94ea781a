"""One DRA claim's container under MPS (issue 56): the process runs with the environment `tessera dra-plugin` writes
into the claim's CDI spec (dra/src/plugin/cdi.rs: CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=<MiB>M and
CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=<ceil(milli/10)>, set by the caller), and measures what MPS lets it have:
  - memory: 256 MiB allocations until the first out-of-memory (the most a tenant of that claim can hold);
  - compute: bf16 8192^3 matrix products from a shared wall-clock start for SECS (TFLOP/s under its thread cap).
Prints one JSON line."""
import json, os, sys, time
import torch

name, start, secs, probe_memory = sys.argv[1], float(sys.argv[2]), float(sys.argv[3]), sys.argv[4] == "1"
out = dict(claim=name, mem_limit=os.environ.get("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"),
           thread_pct=os.environ.get("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"))
n = 8192
a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
for _ in range(3):
    c = a @ b
torch.cuda.synchronize()
while time.time() < start:
    time.sleep(0.0005)
t0 = time.perf_counter(); products = 0
while time.perf_counter() - t0 < secs:
    for _ in range(5):
        c = a @ b
    torch.cuda.synchronize(); products += 5
t = time.perf_counter() - t0
out["tflops"] = round(products * 2 * n ** 3 / t / 1e12, 1)
if probe_memory:
    held = []
    try:
        while len(held) < 4 * 1024:  # bounded: at most 1 TiB asked for
            held.append(torch.empty(256 << 20, dtype=torch.uint8, device="cuda"))
    except torch.OutOfMemoryError as e:
        out["oom"] = str(e).splitlines()[0][:160]
    out["allocated_mib"] = len(held) * 256
    out["matrices_mib"] = 3 * n * n * 2 >> 20  # a, b and c, held beside the probe
    out["torch_reserved_mib"] = torch.cuda.memory_reserved() >> 20
    free, total = torch.cuda.mem_get_info()
    out["mem_get_info_total_mib"] = total >> 20
    out["mem_get_info_free_mib"] = free >> 20
print(json.dumps(out), flush=True)
