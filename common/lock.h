/* lock.h: the mutexes every request takes (the inode table's, the descriptor cache's, an inode's own, the
 * index's batch of accesses). Prefix klock_.
 *
 * Their critical sections are a few counters and list links, and on a node where 16 to 64 processes open
 * cached kernels at once (a GPU job's ranks at start-up) many threads meet on them. A default mutex puts
 * a thread that finds it taken to sleep in the kernel (futex_wait), and its holder must wake it
 * (futex_wake): two system calls and a context switch around a section of a few hundred nanoseconds.
 * Profiled on a 16-core host with 32 parallel readers (tests/gpu/run-profile-host.sh), 38% of the
 * daemon's samples were in those futex calls, the kernel's spinning on their hash buckets included. An
 * adaptive mutex spins a bounded while (glibc's mutex_spin_count) before it sleeps, so a short section
 * is waited for in user space. */
#pragma once

/* _GNU_SOURCE (meson.build) gives PTHREAD_MUTEX_ADAPTIVE_NP. */

#include <pthread.h>

static inline void klock_init_hot(pthread_mutex_t *m)
{
        pthread_mutexattr_t a;
        pthread_mutexattr_init(&a);
        pthread_mutexattr_settype(&a, PTHREAD_MUTEX_ADAPTIVE_NP);
        pthread_mutex_init(m, &a);
        pthread_mutexattr_destroy(&a);
}
