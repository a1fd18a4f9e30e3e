/* descent.c: the background descent (evict.h: HOW FAR). A thread of its own, started at the first kick,
 * evicts from the high mark down to the low watermark while writes go on, and wakes for the emptied
 * directories whose grace has passed (prune.c). */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "internal.h"

static void *descent_main(void *arg);

uint64_t kev_low_watermark(struct kfs *fs)
{
        return fs->o.max_size / 100 * fs->o.low_watermark + fs->o.max_size % 100 * fs->o.low_watermark / 100;
}

uint64_t kev_high_mark(struct kfs *fs)
{
        uint64_t low = kev_low_watermark(fs);
        return low + (fs->o.max_size - low) / 2;
}

void kev_set_limits(struct kfs *fs, uint64_t max_size, unsigned low_watermark)
{
        pthread_mutex_lock(&fs->ev->space_lock);
        __atomic_store_n(&fs->o.max_size, max_size, __ATOMIC_RELAXED);
        __atomic_store_n(&fs->o.low_watermark, low_watermark, __ATOMIC_RELAXED);
        fs->ev->descent.quiet_until = 0; /* a smaller limit is worth a look at once */
        uint64_t used = kidx_used(fs->idx) + fs->ev->reserved;
        if (used > max_size && low_watermark == 100 && !fs->ev->descent.stop && kev_descent_started_locked(fs)) {
                fs->ev->descent.kicked = true; /* no margin to start from: down to the limit itself (kev_start) */
                pthread_cond_signal(&fs->ev->descent.cond);
        }
        kev_descent_kick_locked(fs, used, true);
        pthread_mutex_unlock(&fs->ev->space_lock);
}

void kev_note_young(struct kfs *fs, int64_t atime_ns)
{
        int64_t at = atime_ns + (int64_t)__atomic_load_n(&fs->o.grace_ms, __ATOMIC_RELAXED) * 1000000,
                cur = atomic_load(&fs->ev->descent.young_until);
        while ((!cur || at < cur) && !atomic_compare_exchange_weak(&fs->ev->descent.young_until, &cur, at))
                ;
}

/* space_lock held. used: used plus reserved bytes. Wakes the descent if they are past the high mark and
 * it is not running already (HOW FAR). force: even within the quiet period after a descent that freed
 * nothing (a write had to evict in line: worth a look). */
void kev_descent_kick_locked(struct kfs *fs, uint64_t used, bool force)
{
        if (fs->ev->descent.kicked || fs->ev->descent.running || fs->ev->descent.stop || used <= kev_high_mark(fs) ||
            fs->o.low_watermark == 100 || (!force && kfs_now_ns() < fs->ev->descent.quiet_until))
                return;
        fs->ev->descent.kicked = true;
        if (!kev_descent_started_locked(fs))
                fs->ev->descent.kicked = false; /* writes that reach the limit evict in line meanwhile */
        pthread_cond_signal(&fs->ev->descent.cond);
}

/* space_lock held: does a request of bytes fit now? Reserves it if so, and kicks the descent if that
 * takes the cache past the high mark. */
/* The descent (HOW FAR): kicked past the high mark, it evicts down to the low watermark, batch by batch
 * like any eviction, while writes go on; kev_stop() ends it between batches. A cache over its
 * limit at mount (remounted with a smaller max_size) goes down the same way. */
static void *descent_main(void *arg)
{
        struct kfs *fs = arg;
        int64_t again = 0; /* the last run left the cache above its high mark: run again then (ns) */
        unsigned fruitless = 0; /* runs in a row that freed nothing: the retry backs off, to a minute */
        pthread_mutex_lock(&fs->ev->space_lock);
        while (!fs->ev->descent.stop) {
                int64_t prune_at = atomic_load(&fs->ev->prune.next); /* (EMPTIED DIRECTORIES) */
                if (!fs->ev->descent.kicked && (again || prune_at)) {
                        int64_t wake = again && (!prune_at || again < prune_at) ? again : prune_at;
                        struct timespec until = { .tv_sec = wake / 1000000000LL, .tv_nsec = wake % 1000000000LL };
                        if (pthread_cond_timedwait(&fs->ev->descent.cond, &fs->ev->space_lock, &until) != ETIMEDOUT)
                                continue;
                        if (prune_at && prune_at <= kfs_now_ns()) {
                                pthread_mutex_unlock(&fs->ev->space_lock);
                                struct notify_list nl = { 0 };
                                pthread_mutex_lock(&fs->ev->evict_lock);
                                if (!fs->ev->stop) {
                                        kev_prune_due(fs, &nl);
                                        kev_prune_lost(fs, &nl);
                                }
                                pthread_mutex_unlock(&fs->ev->evict_lock);
                                kev_notify_all(fs, &nl);
                                pthread_mutex_lock(&fs->ev->space_lock);
                        }
                        if (again && again <= kfs_now_ns()) {
                                again = 0;
                                fs->ev->descent.kicked = true; /* no write needs to come for it to go on */
                        }
                        continue;
                }
                if (!fs->ev->descent.kicked) {
                        pthread_cond_wait(&fs->ev->descent.cond, &fs->ev->space_lock);
                        continue;
                }
                fs->ev->descent.kicked = false;
                fs->ev->descent.running = true;
                atomic_store(&fs->ev->descent.young_until, 0); /* what this run passes over, from here on */
                pthread_mutex_unlock(&fs->ev->space_lock);
                int64_t freed = kev_evict_to(fs, kev_low_watermark(fs), true);
                if (freed < 0)
                        kfs_log(LOG_ERR, "evicting down to the low watermark failed: %s", strerror((int)-freed));
                atomic_fetch_add(&fs->ev->descent.runs, 1);
                pthread_mutex_lock(&fs->ev->space_lock);
                fs->ev->descent.running = false;
                again = 0;
                uint64_t used = kidx_used(fs->idx) + fs->ev->reserved;
                int64_t young = atomic_load(&fs->ev->descent.young_until), now = kfs_now_ns();
                if (young && used > kev_low_watermark(fs)) {
                        /* It stopped short of the low watermark at entries within the grace: run again as
                         * they age, whatever came before. After a burst faster than the grace, every run
                         * during it freed nothing, and the back-off below left the cache near its limit for
                         * a minute after the last write (issue #24). Not sooner than 10 ms from now. */
                        again = young + 1000000 > now + 10000000 ? young + 1000000 : now + 10000000;
                        fs->ev->descent.quiet_until = again;
                        fruitless = 0;
                } else if (used > kev_high_mark(fs)) {
                        /* What is left is young (grace), open or pinned. Young files age: once the grace
                         * period has passed, the descent runs again by itself (a cache found over its
                         * limit at mount, with no writes coming, stayed over it for good). */
                        int64_t wait = (int64_t)(fs->o.grace_ms > 100 ? fs->o.grace_ms : 100) * 1000000;
                        if (freed <= 0) /* nothing could go: no write kicks it before then either */
                                fs->ev->descent.quiet_until = kfs_now_ns() + wait;
                        fruitless = freed <= 0 ? fruitless + 1 : 0;
                        for (unsigned i = 1; i < fruitless && wait < 60000000000LL; i++)
                                wait *= 2; /* open or pinned files do not age: do not walk them every grace */
                        again = now + (wait < 60000000000LL ? wait : 60000000000LL);
                } else {
                        fruitless = 0;
                }
        }
        pthread_mutex_unlock(&fs->ev->space_lock);
        return NULL;
}

/* space_lock held. The thread starts at its first kick: a mount that never fills its cache has none,
 * and one that cannot start it now (a tasks limit) tries again a second later. */
bool kev_descent_started_locked(struct kfs *fs)
{
        if (fs->ev->descent.started)
                return true;
        int64_t now = kfs_now_ns();
        if (now < fs->ev->descent.retry_at)
                return false;
        int e = -kfs_thread_start(&fs->ev->descent.thread, 0, descent_main, fs);
        fs->ev->descent.started = e == 0;
        if (e) {
                if (!fs->ev->descent.retry_at) /* said once */
                        kfs_log(LOG_WARNING, "no thread for background eviction yet (%s): writes that reach the "
                                             "limit evict in line", strerror(e));
                fs->ev->descent.retry_at = now + 1000000000LL;
        }
        return fs->ev->descent.started;
}

void kev_descent_join(struct kfs *fs)
{
        pthread_mutex_lock(&fs->ev->space_lock);
        fs->ev->descent.stop = true;
        pthread_cond_broadcast(&fs->ev->descent.cond);
        bool descending = fs->ev->descent.started;
        fs->ev->descent.started = false; /* no more kicks */
        pthread_mutex_unlock(&fs->ev->space_lock);
        if (descending)
                pthread_join(fs->ev->descent.thread, NULL);
}
