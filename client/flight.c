/* In-process single flight and the bounded table of built objects (OpenCL programs).
 *
 * A record is keyed by (owner, key hash): the owner is the cl_context (or ze context), so a program
 * is never handed to another context. States:
 *   BUILDING  one thread (the builder) compiles or loads; others asking for the same key wait on
 *             the record's condition variable and then take the builder's outcome, object or error.
 *   READY     kept, holding one reference to obj, until pushed out by the capacity bound (least
 *             recently handed out first), forgotten with its owner, or the handle is closed.
 *   DONE      an outcome that is not kept (an error, capacity 0, or objects that cannot be shared):
 *             it lives until its last waiter has taken it, then goes.
 * All of it is guarded by kc->lock. The table is a list: it holds at most mem_capacity ready records
 * (256 by default) and a lookup is cheap next to any driver call. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "kcache-int.h"

enum { BUILDING, READY, DONE };

struct kcache__flight {
        struct kcache__flight *next;
        const void *owner;
        struct kcache__hash h;
        int state;
        void *obj;              /* one reference held by the record (READY, DONE) */
        int err;
        void *data;             /* the backend's record, free()d with the record */
        const struct kcache__obj_ops *ops;
        pthread_cond_t cond;
        int waiters;
        uint64_t used;          /* LRU tick of the last hand-out */
};

static struct kcache__flight *find(kcache *kc, const void *owner, struct kcache__hash h)
{
        for (struct kcache__flight *f = kc->flights; f; f = f->next)
                if (f->owner == owner && f->h.hi == h.hi && f->h.lo == h.lo && f->state != DONE)
                        return f;
        return NULL;
}

static void unlink_free(kcache *kc, struct kcache__flight *f)
{
        for (struct kcache__flight **pp = &kc->flights; *pp; pp = &(*pp)->next)
                if (*pp == f) {
                        *pp = f->next;
                        break;
                }
        if (f->state == READY)
                kc->nflights--;
        if (f->state == READY && f->ops->leave)
                f->ops->leave(kc, f->obj, f->data);
        if (f->obj && f->ops)
                f->ops->release(kc, f->obj);
        pthread_cond_destroy(&f->cond);
        if (f->data)
                f->ops->free_data(f->data);
        free(f);
}

int kcache__flight_begin(kcache *kc, const void *owner, struct kcache__hash h, const struct kcache__obj_ops *ops,
                         void **obj, int *err)
{
        pthread_mutex_lock(&kc->lock);
        struct kcache__flight *f = find(kc, owner, h);
        if (!f) {
                f = calloc(1, sizeof(*f));
                if (!f) { /* no table: build without single flight */
                        pthread_mutex_unlock(&kc->lock);
                        return KCACHE__FLIGHT_BUILD;
                }
                f->owner = owner;
                f->h = h;
                f->ops = ops;
                f->state = BUILDING;
                pthread_cond_init(&f->cond, NULL);
                f->next = kc->flights;
                kc->flights = f;
                pthread_mutex_unlock(&kc->lock);
                return KCACHE__FLIGHT_BUILD;
        }
        f->waiters++;
        while (f->state == BUILDING)
                pthread_cond_wait(&f->cond, &kc->lock);
        f->waiters--;
        int ret = f->err ? KCACHE__FLIGHT_FAILED : KCACHE__FLIGHT_READY;
        *err = f->err;
        *obj = f->obj;
        if (f->obj && f->ops)
                f->ops->retain(kc, f->obj);
        f->used = ++kc->tick;
        if (f->state == DONE && !f->waiters)
                unlink_free(kc, f);
        pthread_mutex_unlock(&kc->lock);
        return ret;
}

/* Pushes out the least recently used ready records beyond the capacity. */
static void trim(kcache *kc)
{
        while (kc->nflights > kc->mem_capacity) {
                struct kcache__flight *old = NULL;
                for (struct kcache__flight *f = kc->flights; f; f = f->next)
                        if (f->state == READY && !f->waiters && (!old || f->used < old->used))
                                old = f;
                if (!old)
                        return;
                unlink_free(kc, old);
        }
}

void kcache__flight_end(kcache *kc, const void *owner, struct kcache__hash h, const struct kcache__obj_ops *ops,
                        void *obj, int err, void *data)
{
        pthread_mutex_lock(&kc->lock);
        struct kcache__flight *f = find(kc, owner, h); /* the one record not DONE: the builder's */
        if (!f || f->state != BUILDING) { /* begin had no memory for a record */
                pthread_mutex_unlock(&kc->lock);
                if (data)
                        ops->free_data(data);
                return;
        }
        f->obj = obj;
        f->err = err;
        f->data = data;
        f->used = ++kc->tick;
        if (obj && f->ops)
                f->ops->retain(kc, obj);
        bool keep = !err && obj && f->ops && kc->mem_capacity > 0;
        f->state = keep ? READY : DONE;
        pthread_cond_broadcast(&f->cond);
        if (keep) {
                kc->nflights++;
                trim(kc);
        } else if (!f->waiters) {
                unlink_free(kc, f);
        }
        pthread_mutex_unlock(&kc->lock);
}

void kcache__flight_each(kcache *kc, void (*fn)(kcache *kc, void *obj, void *data, void *arg), void *arg)
{
        pthread_mutex_lock(&kc->lock);
        for (struct kcache__flight *f = kc->flights; f; f = f->next)
                if (f->state == READY)
                        fn(kc, f->obj, f->data, arg);
        pthread_mutex_unlock(&kc->lock);
}

void kcache__flight_forget(kcache *kc, const void *owner)
{
        pthread_mutex_lock(&kc->lock);
        for (struct kcache__flight *f = kc->flights, *next; f; f = next) {
                next = f->next;
                if (f->state == READY && !f->waiters && (!owner || f->owner == owner))
                        unlink_free(kc, f);
        }
        pthread_mutex_unlock(&kc->lock);
}
