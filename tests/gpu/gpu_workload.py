"""One pass of GPU runtime work whose caches live in a kcachefs mount (run by run-gpu-checks.sh, on the
GPU machine, twice): distinct Triton kernels, CUDA kernels JIT-compiled by the driver from PTX (CuPy with
CUPY_COMPILE_WITH_PTX=1, its own cache in CUPY_CACHE_DIR), JAX functions with its persistent compilation
cache, and PyTorch Inductor graphs (its FX graph cache in TORCHINDUCTOR_CACHE_DIR). Every result is
checked; prints one line per runtime with the pass's total time (and Inductor's cache hits)."""
import os
import sys
import time

import numpy as np

PASS = sys.argv[1] if len(sys.argv) > 1 else "?"
ONLY = sys.argv[2:]  # runtimes to run (default: all), in this order
N_TRITON, N_CUDA, N_JAX, N_INDUCTOR = 24, 24, 8, 12


def triton_part():
    import torch
    import triton
    import triton.language as tl

    @triton.jit
    def axpb(x_ptr, y_ptr, n, A: tl.constexpr, B: tl.constexpr, BLOCK: tl.constexpr):
        pid = tl.program_id(0)
        offs = pid * BLOCK + tl.arange(0, BLOCK)
        m = offs < n
        x = tl.load(x_ptr + offs, mask=m)
        tl.store(y_ptr + offs, x * A + B, mask=m)

    x = torch.arange(4096, device="cuda", dtype=torch.float32)
    t0 = time.perf_counter()
    for i in range(N_TRITON):  # each constant pair is a distinct compiled kernel
        y = torch.empty_like(x)
        axpb[(4,)](x, y, x.numel(), A=i + 1, B=i, BLOCK=1024)
        assert torch.allclose(y, x * (i + 1) + i), f"triton kernel {i} wrong"
    torch.cuda.synchronize()
    return time.perf_counter() - t0


def cuda_part():
    import cupy as cp
    t0 = time.perf_counter()
    a = cp.arange(4096, dtype=cp.float32)
    for i in range(N_CUDA):
        src = f'extern "C" __global__ void k{i}(const float *a, float *b) {{' \
              f' int g = blockIdx.x * blockDim.x + threadIdx.x; b[g] = a[g] * {i + 2}.0f - {i}.0f; }}'
        mod = cp.RawModule(code=src)
        b = cp.empty_like(a)
        mod.get_function(f"k{i}")((4,), (1024,), (a, b))
        assert cp.allclose(b, a * (i + 2) - i), f"cuda kernel {i} wrong"
    cp.cuda.Device().synchronize()
    return time.perf_counter() - t0


def jax_part():
    import jax
    import jax.numpy as jnp
    jax.config.update("jax_compilation_cache_dir", os.environ["JAX_COMPILATION_CACHE_DIR"])
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    t0 = time.perf_counter()
    x = jnp.arange(1024, dtype=jnp.float32)
    for i in range(N_JAX):
        f = jax.jit(lambda v, i=i: jnp.sin(v) * (i + 1) + jnp.cos(v * i))
        got = np.asarray(f(x))
        want = np.sin(np.arange(1024, dtype=np.float32)) * (i + 1) + np.cos(np.arange(1024, dtype=np.float32) * i)
        assert np.allclose(got, want, atol=1e-3), f"jax function {i} wrong"
    return time.perf_counter() - t0


def inductor_part():
    import torch
    import torch._inductor.config as ic
    from torch._dynamo.utils import counters
    ic.fx_graph_cache = True
    x = torch.arange(4096, device="cuda", dtype=torch.float32) / 4096
    t0 = time.perf_counter()
    for i in range(N_INDUCTOR):  # each constant is a distinct graph, a distinct FX cache entry
        def f(v, a=float(i + 1), b=float(i + 2)):
            return torch.sin(v) * a + torch.cos(v * b)
        got = torch.compile(f, dynamic=False)(x)
        assert torch.allclose(got, f(x), atol=1e-4), f"inductor graph {i} wrong"
        torch._dynamo.reset()
    torch.cuda.synchronize()
    dt = time.perf_counter() - t0
    c = counters["inductor"]
    return dt, f"fx graph cache {c['fxgraph_cache_hit']} hits, {c['fxgraph_cache_miss']} misses"


def cupy_cache_files():
    d = os.environ.get("CUPY_CACHE_DIR", "")
    return sum(len(fs) for _, _, fs in os.walk(d)) if d else 0


PARTS = {"triton": triton_part, "cuda-ptx-jit": cuda_part, "jax": jax_part, "inductor": inductor_part}
for name in ONLY or list(PARTS):
    try:
        r = PARTS[name]()
        dt, more = r if isinstance(r, tuple) else (r, "")
        if name == "cuda-ptx-jit":
            more = f"{cupy_cache_files()} files in CuPy's cache"
        print(f"pass {PASS} {name}: {dt:.2f} s, results correct{', ' + more if more else ''}", flush=True)
    except Exception as e:  # a runtime error is what this check is for: report it, fail at the end
        print(f"pass {PASS} {name}: FAILED: {type(e).__name__}: {e}", flush=True)
        sys.exit(1)
