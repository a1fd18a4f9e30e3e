"""One pass of GPU runtime work whose caches live in a kcachefs mount (run by run-gpu-checks.sh, on the
GPU machine, twice): distinct Triton kernels, CUDA kernels JIT-compiled by the driver from PTX (CuPy with
CUPY_COMPILE_WITH_PTX=1), and JAX functions with its persistent compilation cache. Every result is
checked; prints one line per runtime with the pass's total time."""
import os
import sys
import time

import numpy as np

PASS = sys.argv[1] if len(sys.argv) > 1 else "?"
N_TRITON, N_CUDA, N_JAX = 24, 24, 8


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


for name, part in (("triton", triton_part), ("cuda-ptx-jit", cuda_part), ("jax", jax_part)):
    try:
        print(f"pass {PASS} {name}: {part():.2f} s, results correct", flush=True)
    except Exception as e:  # a runtime error is what this check is for: report it, fail at the end
        print(f"pass {PASS} {name}: FAILED: {type(e).__name__}: {e}", flush=True)
        sys.exit(1)
