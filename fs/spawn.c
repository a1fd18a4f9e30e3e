/* spawn.c: the daemon's helper processes, each the daemon's own binary exec'd afresh.
 *
 * WHY PROCESSES. Some work makes a request of the daemon's own mount: refresh.c's GETATTRs after a
 * release, ring.c's nudges. A daemon thread that waits for its own daemon's answer is not released when
 * the daemon is killed: FUSE waits, uninterruptibly, for the answer of a request it has handed to the
 * daemon, so that thread kept the dying daemon's descriptors, /dev/fuse among them, and the connection
 * never ended: the mount hung with its users in D state. A process exec'd afresh holds none of the
 * daemon's descriptors (posix_spawn closes everything past those it is given), so when the daemon dies
 * the connection ends, and the helper's request with it. It starts with no signal blocked and every
 * signal at its default, whatever the thread that spawned it blocked or libfuse ignored, and the daemon's
 * environment. */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <unistd.h>

#include "kfs.h"

int kfs_spawn_self(char *const argv[], const int *fds, int nfds, pid_t *pid)
{
        /* Each first to a number above 3 + nfds: a dup2 to 3 + i must not overwrite another one's source */
        int high[8];
        if (nfds > 8)
                return -EINVAL;
        for (int i = 0; i < nfds; i++)
                if ((high[i] = fcntl(fds[i], F_DUPFD_CLOEXEC, 3 + nfds)) < 0) {
                        int e = -errno;
                        while (i--)
                                close(high[i]);
                        return e;
                }
        posix_spawn_file_actions_t fa;
        posix_spawnattr_t at;
        posix_spawn_file_actions_init(&fa);
        posix_spawnattr_init(&at);
        for (int i = 0; i < nfds; i++) /* fds[i] becomes the helper's descriptor 3 + i */
                posix_spawn_file_actions_adddup2(&fa, high[i], 3 + i);
        posix_spawn_file_actions_addclosefrom_np(&fa, 3 + nfds);
        sigset_t none, all;
        sigemptyset(&none);
        sigfillset(&all);
        posix_spawnattr_setsigmask(&at, &none);
        posix_spawnattr_setsigdefault(&at, &all);
        posix_spawnattr_setflags(&at, POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF);
        /* the daemon's environment: its binary finds the same libraries (LD_LIBRARY_PATH) as the daemon did */
        int r = posix_spawn(pid, "/proc/self/exe", &fa, &at, argv, environ);
        posix_spawn_file_actions_destroy(&fa);
        posix_spawnattr_destroy(&at);
        for (int i = 0; i < nfds; i++)
                close(high[i]);
        return -r;
}
