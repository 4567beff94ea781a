"""The copy floor of vLLM's sleep mode on this GPU, with PyTorch alone (no vLLM can be carried to this machine).

Level 1 = weights copied to freshly pinned host memory, GPU memory freed; wake = GPU memory back + copy from the
pinned copy. Level 2 wake = weights read from a file (page cache warm, then cold when drop_caches is allowed)
into GPU memory. Residue = this process's GPU memory (NVML) with nothing allocated: the CUDA context plus what
cuBLAS keeps, the part a sleeping vLLM cannot give back. One JSON object per line."""
import json, os, time, sys
import torch, pynvml

pynvml.nvmlInit()
h = pynvml.nvmlDeviceGetHandleByIndex(0)
me = os.getpid()

def proc_mem():
    for p in pynvml.nvmlDeviceGetComputeRunningProcesses(h):
        if p.pid == me:
            return p.usedGpuMemory
    return None

def out(**kw):
    print(json.dumps(kw), flush=True)

torch.cuda.init()
a = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
(a @ a).sum().item()  # loads cuBLAS and its workspace, as a serving engine has
del a
torch.cuda.synchronize(); torch.cuda.empty_cache()
out(what="residue_context_cublas", bytes=proc_mem(), torch_reserved=torch.cuda.memory_reserved())

CHUNK = 256 << 20
for gib in [int(x) for x in sys.argv[1:]] or [2, 16, 60]:
    n = (gib << 30) // CHUNK
    w = [torch.empty(CHUNK, dtype=torch.uint8, device="cuda").fill_(i % 251) for i in range(n)]
    torch.cuda.synchronize()
    before = proc_mem()
    # sleep, level 1
    t0 = time.perf_counter()
    host = [torch.empty(CHUNK, dtype=torch.uint8, pin_memory=True) for _ in range(n)]
    t_pin = time.perf_counter() - t0
    for hh, ww in zip(host, w):
        hh.copy_(ww, non_blocking=True)
    torch.cuda.synchronize()
    del w
    torch.cuda.empty_cache(); torch.cuda.synchronize()
    t_sleep = time.perf_counter() - t0
    asleep = proc_mem()
    # wake, level 1
    t0 = time.perf_counter()
    w = [torch.empty(CHUNK, dtype=torch.uint8, device="cuda") for _ in range(n)]
    for hh, ww in zip(host, w):
        ww.copy_(hh, non_blocking=True)
    torch.cuda.synchronize()
    t_wake = time.perf_counter() - t0
    ok = all(int(ww[0].item()) == i % 251 for i, ww in enumerate(w[:4]))
    out(what="level1", weights_gib=gib, pin_alloc_s=round(t_pin, 3), sleep_s=round(t_sleep, 3),
        wake_s=round(t_wake, 3), gpu_before=before, gpu_asleep=asleep, wake_gbps=round((gib << 30) / t_wake / 1e9, 1),
        intact=ok)
    del host, w
    torch.cuda.empty_cache()

# level 2: from a file (what a wake reloads), warm page cache and, if allowed, cold
path = "/tmp/weights.bin"
for gib in [2, 16]:
    n = (gib << 30) // CHUNK
    with open(path, "wb") as f:
        blk = os.urandom(1 << 20) * 256
        for _ in range(n):
            f.write(blk)
    for cache in ["warm", "cold"]:
        if cache == "cold":
            try:
                os.sync(); open("/proc/sys/vm/drop_caches", "w").write("3\n")
            except OSError as e:
                out(what="level2", weights_gib=gib, cache="cold", skipped=str(e)); continue
        t0 = time.perf_counter()
        buf = torch.empty(CHUNK, dtype=torch.uint8, pin_memory=True)
        w = []
        with open(path, "rb", buffering=0) as f:
            for _ in range(n):
                f.readinto(buf.numpy())
                g = torch.empty(CHUNK, dtype=torch.uint8, device="cuda"); g.copy_(buf); w.append(g)
        torch.cuda.synchronize()
        t = time.perf_counter() - t0
        out(what="level2", weights_gib=gib, cache=cache, wake_s=round(t, 3), gbps=round((gib << 30) / t / 1e9, 2))
        del w; torch.cuda.empty_cache()
    os.remove(path)
