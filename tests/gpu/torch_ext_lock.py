"""torch C++ extensions and a lock left by a killed build (GPU machine, device tool; not in CI).
    python3 tests/gpu/torch_ext_lock.py MOUNT [--without]
MOUNT is a kcachefs mount with -o stale_locks. A first process builds an extension with
TORCH_EXTENSIONS_DIR in the mount and is killed while it holds the build's lock; a second builds the same
extension and must finish (torch versions whose lock is a file made with O_EXCL waited for it forever).
Prints how torch locks, and how long the second build took. --without: MOUNT has no -o stale_locks, and
the second build is expected to be still waiting after 60 s (what the option is for)."""
import inspect
import os
import signal
import subprocess
import sys
import time

mnt = sys.argv[1]
without = "--without" in sys.argv[2:]
env = dict(os.environ, TORCH_EXTENSIONS_DIR=os.path.join(mnt, "torch-extensions"))
BUILD = """
import torch.utils.cpp_extension as ce
m = ce.load_inline(name="kc_lock_ext", cpp_sources="int twice(int x) { return 2 * x; }", functions=["twice"],
                   verbose=False)
assert m.twice(21) == 42
print("built", flush=True)
"""
import torch.utils.file_baton as fb
src = inspect.getsource(fb)
how = "O_EXCL file" if "O_EXCL" in src else "flock" if "flock" in src else "unknown"
print(f"torch {__import__('torch').__version__}: FileBaton locks with {how}", flush=True)

a = subprocess.Popen([sys.executable, "-c", BUILD], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
lock = None
t0 = time.monotonic()
while lock is None and time.monotonic() - t0 < 120 and a.poll() is None:
    for dp, _, fs in os.walk(env["TORCH_EXTENSIONS_DIR"]):
        if "lock" in fs:
            lock = os.path.join(dp, "lock")
    time.sleep(0.05)
if lock is None:
    print(f"FAILED: the first build never held a lock (exit {a.poll()}): {a.stderr.read()[-2000:] if a.poll() is not None else ''}")
    a.kill()
    sys.exit(1)
a.send_signal(signal.SIGKILL)
a.wait()
print(f"killed the first build while it held {os.path.relpath(lock, mnt)}; lock still there: {os.path.exists(lock)}",
      flush=True)
t0 = time.monotonic()
try:
    b = subprocess.run([sys.executable, "-c", BUILD], env=env, capture_output=True, text=True,
                       timeout=60 if without else 240)
except subprocess.TimeoutExpired:
    if without:
        print("without -o stale_locks: the second build still waited for the dead build's lock after 60 s")
        sys.exit(0)
    print("FAILED: the second build still waited for the dead build's lock after 240 s")
    sys.exit(1)
if without:
    print("FAILED: without -o stale_locks the second build did not wait: this torch does not need the option")
    sys.exit(1)
dt = time.monotonic() - t0
if b.returncode != 0 or "built" not in b.stdout:
    print(f"FAILED: the second build failed: {b.stderr[-2000:]}")
    sys.exit(1)
print(f"the second build finished in {dt:.1f} s; lock left: {os.path.exists(lock)}")
