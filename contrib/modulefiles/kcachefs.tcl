#%Module1.0
## Environment Modules (Tcl) version of kcachefs.lua: the same variables.
module-whatis "GPU kernel and compiler caches (NEO, SYCL, PoCL, CUDA, Triton, JAX, Mesa, Numba, ccache, Inductor, CuPy) on a kcachefs mount"
if {[info exists env(KCACHEFS_MOUNT)]} { set mnt $env(KCACHEFS_MOUNT) } else { set mnt /var/cache/kcachefs/mnt }
setenv KCACHEFS_MOUNT $mnt
# kcache env makes each runtime's directory and says where (kcachefs.lua): on a shared mount, in the user's own.
set base $mnt
if {[module-info mode load]} {
    if {[catch {exec kcache env $mnt} out] || ![regexp {KCACHE_DIR='([^']*)/kcache'} $out -> base]} {
        error "kcachefs: kcache env $mnt failed: $out"
    }
}
setenv NEO_CACHE_PERSISTENT 1
setenv NEO_CACHE_DIR $base/neo
setenv NEO_CACHE_MAX_SIZE 0
setenv SYCL_CACHE_PERSISTENT 1
setenv SYCL_CACHE_DIR $base/sycl
unsetenv SYCL_CACHE_MAX_SIZE
setenv POCL_CACHE_DIR $base/pocl
setenv CUDA_CACHE_PATH $base/cuda
setenv CUDA_CACHE_MAXSIZE 4294967296
setenv TRITON_CACHE_DIR $base/triton
setenv JAX_COMPILATION_CACHE_DIR $base/jax
setenv JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS 0
setenv KCACHE_DIR $base/kcache
setenv MESA_SHADER_CACHE_DIR $base/mesa
setenv MESA_SHADER_CACHE_MAX_SIZE 64G
setenv NUMBA_CACHE_DIR $base/numba
setenv CCACHE_DIR $base/ccache
setenv CCACHE_MAXSIZE 0
setenv TORCHINDUCTOR_CACHE_DIR $base/inductor
setenv CUPY_CACHE_DIR $base/cupy
setenv TORCH_EXTENSIONS_DIR $base/torch-extensions
