/* One compilation per node: when many processes miss the same key at once (MPI ranks at job start),
 * the first takes a lock for that key and compiles; the others wait, then find the entry.
 *
 * The lock is a byte of RELDIR/.kcache.lock, at an offset taken from the key hash, held as an open
 * file description lock (F_OFD_SETLK): it belongs to this open file, so threads of one process exclude
 * each other too, and the kernel drops it when the holder dies, SIGKILL included. Two keys may share a
 * byte (2^20 of them): then one waits needlessly, never wrongly. A holder that hangs is waited for at
 * most lock_timeout_ms; then the waiter compiles itself. On kcachefs the lock file matches the default
 * pin pattern *.lock and is never evicted. Waiting polls (1 ms growing to 25 ms): a compile takes far
 * longer, and F_OFD_SETLKW has no timeout. */
#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "kcache-int.h"

int kcache__lock(kcache *kc, const char *reldir, const struct kcache__key *key, bool *ret_waited)
{
        *ret_waited = false;
        char path[4096];
        snprintf(path, sizeof(path), "%s/.kcache.lock", reldir);
        int fd = openat(kc->dirfd, path, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0666);
        if (fd < 0 && errno == ENOENT && kcache__make_dirs(kc, reldir) == 0)
                fd = openat(kc->dirfd, path, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0666);
        if (fd < 0) {
                kcache__trace(kc, "lock %s: %s; compiling without it", path, strerror(errno));
                return -1;
        }
        struct stat st;
        if (!fstat(fd, &st) && st.st_uid == geteuid() && (st.st_mode & 0777) != 0666)
                fchmod(fd, 0666); /* every user of a shared cache must be able to take it */
        struct flock fl = { .l_type = F_WRLCK, .l_whence = SEEK_SET,
                            .l_start = (off_t)(key->hash.lo & ((1u << 20) - 1)), .l_len = 1 };
        double start = kcache__now_ms();
        long delay = 1;
        bool waited = false;
        for (;;) {
                if (!fcntl(fd, F_OFD_SETLK, &fl))
                        break;
                if (errno != EAGAIN && errno != EACCES && errno != EINTR) {
                        kcache__trace(kc, "lock %s: %s; compiling without it", path, strerror(errno));
                        close(fd);
                        return -1;
                }
                if (!waited) {
                        waited = true;
                        atomic_fetch_add(&kc->st.lock_waits, 1);
                        kcache__trace(kc, "wait: another process is compiling this key");
                }
                if (kcache__now_ms() - start >= (double)kc->lock_timeout_ms) {
                        kcache__trace(kc, "wait: gave up after %.0f ms; compiling it here", kcache__now_ms() - start);
                        close(fd);
                        return -1;
                }
                struct timespec ts = { 0, delay * 1000000 };
                nanosleep(&ts, NULL);
                if (delay < 25)
                        delay += delay / 2 + 1;
        }
        if (waited)
                kcache__trace(kc, "wait: done after %.0f ms", kcache__now_ms() - start);
        *ret_waited = waited;
        return fd;
}

void kcache__unlock(int fd)
{
        if (fd >= 0)
                close(fd); /* closing the description releases its OFD locks */
}
