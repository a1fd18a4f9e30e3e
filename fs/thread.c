/* thread.c: the threads the daemon starts while it serves.
 *
 * A new thread takes its creator's CPU affinity. Most of the daemon's own threads start at the first
 * request that needs them (settle.c's settler at the first write, the reapers and the descent at the
 * first eviction, refresh.c's refresher at the first release, kprune.c's at the first prune, the shared
 * tier's at its first fetch or store), and with FUSE over io_uring that request is served by a ring
 * thread pinned to its queue's CPU (ring.c, THREADS). Started there, the thread stayed on that one CPU
 * for good, and so did the helper process it spawns (refresh.c's child): all of the daemon's background
 * work on one CPU, beside that CPU's queue, while the others had none. So a thread started here runs on
 * the CPUs the daemon had when it started (kfs_thread_init), whoever starts it. Where that set is no
 * longer allowed (a cpuset changed since), it takes its creator's, as before.
 *
 * The signal mask is still the creator's: a ring thread blocks every signal, as a background thread
 * should too (the waits that need KFS_WAKE_SIGNAL unblock it themselves: kfs_wake_signal_accept). */
#include <errno.h>
#include <sched.h>

#include "kfs.h"

static cpu_set_t start_cpus;
static bool start_cpus_ok;

void kfs_thread_init(void)
{
        start_cpus_ok = sched_getaffinity(0, sizeof(start_cpus), &start_cpus) == 0;
}

int kfs_thread_start(pthread_t *th, size_t stack, void *(*fn)(void *), void *arg)
{
        for (bool pin = start_cpus_ok;; pin = false) {
                pthread_attr_t a;
                int e = pthread_attr_init(&a);
                if (e)
                        return -e;
                if (stack)
                        (void)pthread_attr_setstacksize(&a, stack);
                bool pinned = pin && pthread_attr_setaffinity_np(&a, sizeof(start_cpus), &start_cpus) == 0;
                e = pthread_create(th, &a, fn, arg);
                pthread_attr_destroy(&a);
                if (e != EINVAL || !pinned) /* EINVAL: the CPUs it started with are not all allowed any more */
                        return -e;
        }
}
