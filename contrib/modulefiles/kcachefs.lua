-- Lmod module: point every GPU runtime at the node's kcachefs mount, each in its own subdirectory,
-- with the runtimes' own size limits off (kcachefs enforces one limit for all).
-- The mount is set up by the site (systemd unit, fstab or a job prolog); KCACHEFS_MOUNT overrides it.
help([[kcachefs: a size-limited, LRU-evicted GPU kernel cache shared by every job on this node.]])
whatis("Name: kcachefs")
whatis("Description: GPU kernel cache (NEO, SYCL, PoCL, CUDA, Triton, JAX) on a kcachefs mount")

local mnt = os.getenv("KCACHEFS_MOUNT") or "/var/cache/kcachefs/mnt"
setenv("KCACHEFS_MOUNT", mnt)
setenv("NEO_CACHE_PERSISTENT", "1")
setenv("NEO_CACHE_DIR", pathJoin(mnt, "neo"))
setenv("NEO_CACHE_MAX_SIZE", "0")
setenv("SYCL_CACHE_PERSISTENT", "1")
setenv("SYCL_CACHE_DIR", pathJoin(mnt, "sycl"))
unsetenv("SYCL_CACHE_MAX_SIZE")
setenv("POCL_CACHE_DIR", pathJoin(mnt, "pocl"))
setenv("CUDA_CACHE_PATH", pathJoin(mnt, "cuda"))
setenv("TRITON_CACHE_DIR", pathJoin(mnt, "triton"))
setenv("JAX_COMPILATION_CACHE_DIR", pathJoin(mnt, "jax"))
setenv("KCACHE_DIR", pathJoin(mnt, "kcache"))
