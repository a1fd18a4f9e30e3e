"""One process of run-remote-gpu.sh (the shared tier on the GPU machine; not in CI): compiles and runs a
few Triton kernels, or a torch.compile'd MLP through Inductor, with the caches wherever the environment
puts them (TRITON_CACHE_DIR, TORCHINDUCTOR_CACHE_DIR: a kcachefs mount with -o remote=), saves the results
for the script to compare across processes, and prints one JSON line: the wall time of the first call
(compile, or load from the cache, and run), and how many files Triton's cache was asked to store in this
process (FileCacheManager.put: each compile stores its stages; a process served from the cache stores
none). Inductor's compile workers are kept in this process (TORCHINDUCTOR_COMPILE_THREADS=1, set by the
script) so that the count sees every Triton compile.
    remote_workload.py triton|inductor OUT      a part; OUT: the results (torch.save)
    remote_workload.py sim OUT                  no GPU, no torch: Triton-like and Inductor-like entries made or
                                                 read (the script's dry run on a machine without a GPU)
    remote_workload.py compare OUT1 OUT2        exit 0 if both hold equal results"""
import json
import os
import sys
import time

PART, OUT = sys.argv[1], sys.argv[2]


def count_triton_puts():
    """Counts the files Triton's cache stores from now on (None if this Triton has no FileCacheManager.put)."""
    from triton.runtime import cache as tcache
    n = [0]
    orig = getattr(tcache.FileCacheManager, "put", None)
    if orig is None:
        return lambda: None

    def put(self, *a, **k):
        n[0] += 1
        return orig(self, *a, **k)
    tcache.FileCacheManager.put = put
    return lambda: n[0]


def triton_part():
    import torch
    import triton
    import triton.language as tl
    puts = count_triton_puts()

    @triton.jit
    def add(x_ptr, y_ptr, z_ptr, n, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        m = offs < n
        tl.store(z_ptr + offs, tl.load(x_ptr + offs, mask=m) + tl.load(y_ptr + offs, mask=m), mask=m)

    @triton.jit
    def axpb(x_ptr, y_ptr, n, A: tl.constexpr, B: tl.constexpr, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        m = offs < n
        tl.store(y_ptr + offs, tl.load(x_ptr + offs, mask=m) * A + B, mask=m)

    g = torch.Generator().manual_seed(0)
    x = torch.rand(1 << 20, generator=g).cuda()
    y = torch.rand(1 << 20, generator=g).cuda()
    grid = (triton.cdiv(x.numel(), 1024),)
    t0 = time.perf_counter()
    outs = [torch.empty_like(x) for _ in range(5)]
    add[grid](x, y, outs[0], x.numel(), BLOCK=1024)
    for i in range(1, 5):  # each constant pair is a kernel of its own: a cache entry of its own
        axpb[grid](x, outs[i], x.numel(), A=i + 1, B=i, BLOCK=1024)
    torch.cuda.synchronize()
    secs = time.perf_counter() - t0
    assert torch.allclose(outs[0], x + y)
    for i in range(1, 5):
        assert torch.allclose(outs[i], x * (i + 1) + i)
    torch.save([o.cpu() for o in outs], OUT)
    return {"secs": round(secs, 3), "triton_puts": puts(), "kernels": 5, "torch": torch.__version__,
            "triton": triton.__version__, "gpu": torch.cuda.get_device_name()}


def inductor_part():
    import torch
    import torch._inductor.config as ic
    from torch._dynamo.utils import counters
    import triton
    puts = count_triton_puts()
    ic.fx_graph_cache = True
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(512, 1024), torch.nn.GELU(), torch.nn.Linear(1024, 512),
                                torch.nn.LayerNorm(512)).cuda()
    x = torch.randn(64, 512, device="cuda")
    with torch.no_grad():
        t0 = time.perf_counter()
        y = torch.compile(model)(x)
        torch.cuda.synchronize()
        secs = time.perf_counter() - t0
        assert torch.allclose(y, model(x), atol=1e-4)
    torch.save(y.cpu(), OUT)
    ind, aot = counters["inductor"], counters["aot_autograd"]
    return {"secs": round(secs, 3), "triton_puts": puts(), "fxgraph_cache_hit": ind["fxgraph_cache_hit"],
            "fxgraph_cache_miss": ind["fxgraph_cache_miss"], "autograd_cache_hit": aot["autograd_cache_hit"],
            "autograd_cache_miss": aot["autograd_cache_miss"], "torch": torch.__version__,
            "triton": triton.__version__, "gpu": torch.cuda.get_device_name()}


def sim_part():
    """Without Triton or torch, the moves of their caches: Triton's FileCacheManager (the key directory
    made, the group file looked up; found, its files are read; not, they are stored, each renamed into
    place) in TRITON_CACHE_DIR, or under TORCHINDUCTOR_CACHE_DIR/triton/0 as Inductor puts it, where also
    an FX graph entry is looked for as Inductor does (its key directory tested, then listed) and stored
    under a name of its own on a miss."""
    ind = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    base = os.path.join(ind, "triton", "0") if ind else os.environ["TRITON_CACHE_DIR"]
    d = os.path.join(base, "ABCDEFGHIJKLMNOPQRSTUVWXYZ234567ABCDEFGHIJKLMNOPQRST")
    t0 = time.perf_counter()
    os.makedirs(d, exist_ok=True)
    files = {"k.cubin": os.urandom(4096), "k.json": b"{}", "__grp__k.json": b'{"child_paths": {}}'}
    r = {"triton_puts": 0, "gpu": "none (sim)"}
    if not os.path.exists(os.path.join(d, "__grp__k.json")):
        for name, data in files.items():
            with open(os.path.join(d, name + ".tmp"), "wb") as f:
                f.write(data)
            os.replace(os.path.join(d, name + ".tmp"), os.path.join(d, name))
            r["triton_puts"] += 1
    if ind:
        sub = os.path.join(ind, "fxgraph", "ab", "fabcdefghijklmnopqrstuvwxyz234567abcdefghijklmnopqrst")
        hit = os.path.exists(sub) and len(os.listdir(sub)) > 0
        r.update(fxgraph_cache_hit=int(hit), fxgraph_cache_miss=int(not hit))
        if not hit:
            os.makedirs(sub, exist_ok=True)
            with open(os.path.join(sub, os.urandom(8).hex()), "wb") as f:
                f.write(b"graph")
    with open(os.path.join(d, "k.cubin"), "rb") as f, open(OUT, "wb") as o:
        o.write(f.read())
    return dict(secs=round(time.perf_counter() - t0, 3), **r)


def compare(a, b):
    if os.environ.get("KC_SIM"):
        return open(a, "rb").read() == open(b, "rb").read()
    import torch
    ra, rb = torch.load(a), torch.load(b)
    ra, rb = (ra, rb) if isinstance(ra, list) else ([ra], [rb])
    return len(ra) == len(rb) and all(torch.equal(p, q) for p, q in zip(ra, rb))


if __name__ == "__main__":
    if PART == "compare":
        sys.exit(0 if compare(OUT, sys.argv[3]) else 1)
    r = {"triton": triton_part, "inductor": inductor_part, "sim": sim_part}[PART]()
    print(json.dumps(dict(part=PART, **r)), flush=True)
