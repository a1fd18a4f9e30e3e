-- Lmod module (what `kcache env` prints, tests/integration/test_contrib.py checks it): point every GPU runtime at the node's kcachefs mount, each in its own subdirectory,
-- with the runtimes' own size limits off (kcachefs enforces one limit for all).
-- The mount is set up by the site (systemd unit, fstab or a job prolog); KCACHEFS_MOUNT overrides it.
help([[kcachefs: a size-limited, LRU-evicted GPU kernel cache shared by every job on this node.]])
whatis("Name: kcachefs")
whatis("Description: GPU kernel and compiler caches (NEO, SYCL, PoCL, CUDA, Triton, JAX, Mesa, Numba, ccache, Inductor, CuPy) on a kcachefs mount")

local mnt = os.getenv("KCACHEFS_MOUNT") or "/var/cache/kcachefs/mnt"
setenv("KCACHEFS_MOUNT", mnt)
-- kcache env makes each runtime's directory and says where: in the mount itself, or, on a mount other users
-- share, in a directory of the user's own that the daemon makes (MOUNT/users/<uid>, 0700), so that no user's
-- binary is ever loaded by another's process. Never in a directory shared by users.
local base = mnt
if mode() == "load" then
  local out = capture("kcache env '" .. mnt .. "' 2>&1")
  base = out:match("KCACHE_DIR='([^']*)/kcache'")
  if not base then
    LmodError("kcachefs: kcache env " .. mnt .. " failed: " .. out)
  end
end
setenv("NEO_CACHE_PERSISTENT", "1")
setenv("NEO_CACHE_DIR", pathJoin(base, "neo"))
setenv("NEO_CACHE_MAX_SIZE", "0")
setenv("SYCL_CACHE_PERSISTENT", "1")
setenv("SYCL_CACHE_DIR", pathJoin(base, "sycl"))
unsetenv("SYCL_CACHE_MAX_SIZE")
setenv("POCL_CACHE_DIR", pathJoin(base, "pocl"))
setenv("CUDA_CACHE_PATH", pathJoin(base, "cuda"))
setenv("CUDA_CACHE_MAXSIZE", "4294967296")
setenv("TRITON_CACHE_DIR", pathJoin(base, "triton"))
setenv("JAX_COMPILATION_CACHE_DIR", pathJoin(base, "jax"))
setenv("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
setenv("KCACHE_DIR", pathJoin(base, "kcache"))
setenv("MESA_SHADER_CACHE_DIR", pathJoin(base, "mesa"))
setenv("MESA_SHADER_CACHE_MAX_SIZE", "64G")
setenv("NUMBA_CACHE_DIR", pathJoin(base, "numba"))
setenv("CCACHE_DIR", pathJoin(base, "ccache"))
setenv("CCACHE_MAXSIZE", "0")
setenv("TORCHINDUCTOR_CACHE_DIR", pathJoin(base, "inductor"))
setenv("CUPY_CACHE_DIR", pathJoin(base, "cupy"))
setenv("TORCH_EXTENSIONS_DIR", pathJoin(base, "torch-extensions"))
