#%Module1.0
## Environment Modules (Tcl) version of kcachefs.lua: the same variables.
module-whatis "GPU kernel cache (NEO, SYCL, PoCL, CUDA, Triton, JAX) on a kcachefs mount"
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
setenv TRITON_CACHE_DIR $mnt/triton
setenv JAX_COMPILATION_CACHE_DIR $mnt/jax
setenv KCACHE_DIR $mnt/kcache
