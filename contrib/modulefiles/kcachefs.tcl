#%Module1.0
## Environment Modules (Tcl) version of kcachefs.lua: the same variables.
module-whatis "GPU kernel and compiler caches (NEO, SYCL, PoCL, CUDA, Triton, JAX, Mesa, Numba, ccache, Inductor, CuPy) on a kcachefs mount"
if {[info exists env(KCACHEFS_MOUNT)]} { set mnt $env(KCACHEFS_MOUNT) } else { set mnt /var/cache/kcachefs/mnt }
setenv KCACHEFS_MOUNT $mnt
setenv NEO_CACHE_PERSISTENT 1
setenv NEO_CACHE_DIR $mnt/neo
setenv NEO_CACHE_MAX_SIZE 0
setenv SYCL_CACHE_PERSISTENT 1
setenv SYCL_CACHE_DIR $mnt/sycl
unsetenv SYCL_CACHE_MAX_SIZE
setenv POCL_CACHE_DIR $mnt/pocl
setenv CUDA_CACHE_PATH $mnt/cuda
setenv CUDA_CACHE_MAXSIZE 4294967296
setenv TRITON_CACHE_DIR $mnt/triton
setenv JAX_COMPILATION_CACHE_DIR $mnt/jax
setenv JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS 0
setenv KCACHE_DIR $mnt/kcache
setenv MESA_SHADER_CACHE_DIR $mnt/mesa
setenv MESA_SHADER_CACHE_MAX_SIZE 64G
setenv NUMBA_CACHE_DIR $mnt/numba
setenv CCACHE_DIR $mnt/ccache
setenv CCACHE_MAXSIZE 0
setenv TORCHINDUCTOR_CACHE_DIR $mnt/inductor
setenv CUPY_CACHE_DIR $mnt/cupy
setenv TORCH_EXTENSIONS_DIR $mnt/torch-extensions
