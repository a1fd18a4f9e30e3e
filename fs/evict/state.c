/* state.c: eviction's state, struct kev (internal.h): made at start-up, started after the mount,
 * stopped before the index closes, freed at exit; and the counters kcache stats shows. */
#include <errno.h>
#include <stdlib.h>

#include "internal.h"

int kev_init(struct kfs *fs)
{
        struct kev *ev = calloc(1, sizeof(*ev));
        if (!ev)
                return -ENOMEM;
        ev->now = kfs_now_ns;
        pthread_mutex_init(&ev->evict_lock, NULL);
        pthread_mutex_init(&ev->space_lock, NULL);
        pthread_cond_init(&ev->space_cond, NULL);
        pthread_cond_init(&ev->descent.cond, NULL);
        pthread_cond_init(&ev->repair_cond, NULL);
        pthread_mutex_init(&ev->reap.lock, NULL);
        pthread_cond_init(&ev->reap.cond, NULL);
        kmap_init(&ev->prune.lost_at);
        pthread_mutex_init(&ev->miss.lock, NULL);
        pthread_mutex_init(&ev->marks.lock, NULL);
        kmap_init(&ev->miss.at);
        fs->ev = ev;
        return 0;
}

void kev_start(struct kfs *fs)
{
        pthread_mutex_lock(&fs->ev->space_lock);
        uint64_t used = kidx_used(fs->idx);
        if (used > fs->o.max_size && fs->o.low_watermark == 100 && kev_descent_started_locked(fs)) {
                fs->ev->descent.kicked = true; /* over a smaller limit: down to it, even without a margin */
                pthread_cond_signal(&fs->ev->descent.cond);
        }
        kev_descent_kick_locked(fs, used, false);
        pthread_mutex_unlock(&fs->ev->space_lock);
}

void kev_stop(struct kfs *fs)
{
        pthread_mutex_lock(&fs->ev->evict_lock);
        fs->ev->stop = true;
        pthread_mutex_unlock(&fs->ev->evict_lock);
        kev_descent_join(fs);
        kev_repairer_stop(fs);
}

void kev_free(struct kfs *fs)
{
        if (!fs->ev)
                return;
        kev_prune_free(fs);
        kev_repair_free(fs);
        kev_miss_free(fs);
        kev_marks_free(fs);
        free(fs->ev->reap.q);
        pthread_mutex_destroy(&fs->ev->evict_lock);
        pthread_mutex_destroy(&fs->ev->space_lock);
        pthread_mutex_destroy(&fs->ev->reap.lock);
        free(fs->ev);
        fs->ev = NULL;
}

void kev_counts(struct kfs *fs, struct kev_counts *c)
{
        c->helped_writes = atomic_load(&fs->ev->helped_writes);
        c->blocked_writes = atomic_load(&fs->ev->blocked_writes);
        c->descents = atomic_load(&fs->ev->descent.runs);
        kev_miss_counts(fs, c);
}

void kev_zero_counts(struct kfs *fs)
{
        atomic_store(&fs->ev->helped_writes, 0);
        atomic_store(&fs->ev->blocked_writes, 0);
        atomic_store(&fs->ev->descent.runs, 0);
        kev_miss_zero(fs);
}
