/* notify.c: tells the kernel about names that eviction removed.
 *
 * fuse_lowlevel_notify_inval_entry() takes the parent directory's lock in the kernel. A request handler
 * may be running on behalf of a syscall that holds that very lock (a create in that directory), and our
 * own locks may be wanted by requests the kernel is waiting on, so the call is made here, by one thread
 * that holds no lock of ours. Requests wait for their tickets with a bound (WAIT_MS), which only expires
 * in the rare case where the kernel holds the directory for a request that waits on this one.
 *
 * Invariant: done <= queued; every item with ticket <= done has been handed to the kernel. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kfs.h"

#define WAIT_MS 200

struct item {
        fuse_ino_t parent;
        char *name;
        uint64_t ticket;
        struct item *next;
};

struct kfs_notifier {
        pthread_t thread;
        pthread_mutex_t lock;
        pthread_cond_t wake;  /* items queued or stop */
        pthread_cond_t done_cond;
        struct item *head, *tail; /* lock */
        uint64_t queued, done;    /* tickets; lock */
        bool stop;                /* lock */
};

static void *notifier_main(void *arg)
{
        struct kfs *fs = arg;
        struct kfs_notifier *n = fs->notifier;
        pthread_mutex_lock(&n->lock);
        for (;;) {
                while (!n->head && !n->stop)
                        pthread_cond_wait(&n->wake, &n->lock);
                if (!n->head && n->stop)
                        break;
                struct item *it = n->head;
                n->head = it->next;
                if (!n->head)
                        n->tail = NULL;
                pthread_mutex_unlock(&n->lock);
                /* -ENOENT: the kernel no longer knows the parent, so it has no dentry to drop. */
                (void)fuse_lowlevel_notify_inval_entry(fs->se, it->parent, it->name, strlen(it->name));
                pthread_mutex_lock(&n->lock);
                n->done = it->ticket;
                pthread_cond_broadcast(&n->done_cond);
                free(it->name);
                free(it);
        }
        pthread_mutex_unlock(&n->lock);
        return NULL;
}

int kfs_notifier_start(struct kfs *fs)
{
        struct kfs_notifier *n = calloc(1, sizeof(*n));
        if (!n)
                return -ENOMEM;
        pthread_mutex_init(&n->lock, NULL);
        pthread_cond_init(&n->wake, NULL);
        pthread_cond_init(&n->done_cond, NULL);
        fs->notifier = n;
        int r = pthread_create(&n->thread, NULL, notifier_main, fs);
        if (r != 0) {
                fs->notifier = NULL;
                free(n);
                return -r;
        }
        return 0;
}

void kfs_notifier_stop(struct kfs *fs)
{
        struct kfs_notifier *n = fs->notifier;
        if (!n)
                return;
        pthread_mutex_lock(&n->lock);
        n->stop = true;
        pthread_cond_broadcast(&n->wake);
        pthread_cond_broadcast(&n->done_cond);
        pthread_mutex_unlock(&n->lock);
        pthread_join(n->thread, NULL);
        pthread_mutex_destroy(&n->lock);
        pthread_cond_destroy(&n->wake);
        pthread_cond_destroy(&n->done_cond);
        free(n);
        fs->notifier = NULL;
}

uint64_t kfs_notify_entry(struct kfs *fs, fuse_ino_t parent, const char *name)
{
        struct kfs_notifier *n = fs->notifier;
        struct item *it = calloc(1, sizeof(*it));
        if (!n || !it || !(it->name = strdup(name))) {
                free(it);
                return 0;
        }
        it->parent = parent;
        pthread_mutex_lock(&n->lock);
        uint64_t ticket = it->ticket = ++n->queued;
        if (n->tail)
                n->tail->next = it;
        else
                n->head = it;
        n->tail = it;
        pthread_cond_signal(&n->wake);
        pthread_mutex_unlock(&n->lock);
        return ticket; /* it may be freed by now */
}

void kfs_notify_wait(struct kfs *fs, uint64_t t)
{
        struct kfs_notifier *n = fs->notifier;
        if (!n || t == 0)
                return;
        struct timespec dl;
        clock_gettime(CLOCK_REALTIME, &dl);
        dl.tv_nsec += WAIT_MS * 1000000L;
        dl.tv_sec += dl.tv_nsec / 1000000000L;
        dl.tv_nsec %= 1000000000L;
        pthread_mutex_lock(&n->lock);
        while (n->done < t && !n->stop)
                if (pthread_cond_timedwait(&n->done_cond, &n->lock, &dl) == ETIMEDOUT)
                        break;
        pthread_mutex_unlock(&n->lock);
}
