"""One tenant of the bandwidth test: a decode-like step (a batch of 8 rows times a bf16 weight matrix that does not
fit in L2, read once per step) repeated until the shared start + duration; prints its steps and the weight bytes it
read per second. Tenants start at the same wall-clock instant so their steps overlap."""
import json, os, sys, time
import torch
start, secs, gib, name = float(sys.argv[1]), float(sys.argv[2]), float(sys.argv[3]), sys.argv[4]
rows = 8192
cols = int(gib * (1 << 30) / 2 / rows)
W = torch.randn(rows, cols, device="cuda", dtype=torch.bfloat16)
x = torch.randn(8, rows, device="cuda", dtype=torch.bfloat16)
for _ in range(3):
    y = x @ W
torch.cuda.synchronize()
while time.time() < start:
    time.sleep(0.0005)
t0 = time.perf_counter(); steps = 0; lat = []
while time.perf_counter() - t0 < secs:
    s = time.perf_counter()
    for _ in range(10):
        y = x @ W
    torch.cuda.synchronize()
    lat.append((time.perf_counter() - s) / 10); steps += 10
t = time.perf_counter() - t0
lat.sort()
print(json.dumps(dict(tenant=name, mps_pct=os.environ.get("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"), steps=steps,
      step_ms_p50=round(lat[len(lat)//2]*1e3, 3), weight_gbps=round(steps * W.numel() * 2 / t / 1e9, 1))), flush=True)
