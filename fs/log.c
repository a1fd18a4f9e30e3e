/* log.c: where a detached daemon's messages go.
 *
 * Everything the daemon says goes to stderr (eviction failures, index flush failures, transport errors,
 * libfuse's own messages). In the foreground (-f, as the systemd unit runs it) stderr is the terminal or
 * the journal. A detached daemon has neither: its stderr becomes a pipe, and a thread of its own here
 * reads it line by line and hands each line to syslog (the journal, where systemd runs), with the
 * daemon's pid and the facility daemon.
 *
 * RATE. A failure that repeats (a full disk under every write) must not flood the log: a bucket of
 * LOG_BURST lines refills at one line per LOG_REFILL_S seconds; lines beyond it are counted, and the next
 * line that passes says how many were dropped. The pipe's write end never blocks: if this thread falls
 * behind by a pipe's worth (64 KiB), further lines are lost rather than stall a request. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <syslog.h>
#include <time.h>
#include <unistd.h>

#include "kfs.h"

#define LOG_BURST 20
#define LOG_REFILL_S 5

struct kfs_log { /* lives from kfs_log_detach() to kfs_log_finish() */
        int rfd;
        pthread_t th;
        double tokens;
        struct timespec last;
        unsigned long dropped;
};

static int priority_of(const char *line)
{
        if (strstr(line, "warning"))
                return LOG_WARNING;
        if (strstr(line, "failed") || strstr(line, "cannot") || strstr(line, "error"))
                return LOG_ERR;
        return LOG_NOTICE;
}

static void emit(struct kfs_log *l, const char *line)
{
        struct timespec now;
        clock_gettime(CLOCK_MONOTONIC, &now);
        double dt = (double)(now.tv_sec - l->last.tv_sec) + (double)(now.tv_nsec - l->last.tv_nsec) / 1e9;
        l->last = now;
        l->tokens += dt / LOG_REFILL_S;
        if (l->tokens > LOG_BURST)
                l->tokens = LOG_BURST;
        if (l->tokens < 1) {
                l->dropped++;
                return;
        }
        l->tokens -= 1;
        if (l->dropped) {
                syslog(LOG_WARNING, "%lu messages dropped (more than %d at once)", l->dropped, LOG_BURST);
                l->dropped = 0;
        }
        const char *msg = strncmp(line, "kcachefs: ", 10) ? line : line + 10; /* syslog names us already */
        syslog(priority_of(msg), "%s", msg);
}

static void *log_main(void *arg)
{
        struct kfs_log *l = arg;
        char buf[4096];
        size_t have = 0;
        for (;;) {
                ssize_t n = read(l->rfd, buf + have, sizeof(buf) - 1 - have);
                if (n < 0 && errno == EINTR)
                        continue;
                if (n <= 0)
                        break;
                have += (size_t)n;
                buf[have] = '\0';
                char *p = buf, *nl;
                while ((nl = strchr(p, '\n'))) {
                        *nl = '\0';
                        if (*p)
                                emit(l, p);
                        p = nl + 1;
                }
                have = (size_t)(buf + have - p);
                memmove(buf, p, have);
                if (have == sizeof(buf) - 1) { /* a line longer than the buffer: cut */
                        buf[have] = '\0';
                        emit(l, buf);
                        have = 0;
                }
        }
        return NULL;
}

int kfs_log_detach(struct kfs_log **ret)
{
        int p[2];
        if (pipe2(p, O_CLOEXEC) < 0)
                return -errno;
        struct kfs_log *l = calloc(1, sizeof(*l)); /* lives as long as the process */
        if (!l) {
                close(p[0]);
                close(p[1]);
                return -ENOMEM;
        }
        l->rfd = p[0];
        l->tokens = LOG_BURST;
        clock_gettime(CLOCK_MONOTONIC, &l->last);
        openlog("kcachefs", LOG_PID | LOG_NDELAY, LOG_DAEMON);
        (void)fcntl(p[1], F_SETFL, O_NONBLOCK);
        sigset_t all, old;
        sigfillset(&all);
        pthread_sigmask(SIG_BLOCK, &all, &old);
        int e = pthread_create(&l->th, NULL, log_main, l);
        pthread_sigmask(SIG_SETMASK, &old, NULL);
        if (e != 0) {
                close(p[0]);
                close(p[1]);
                free(l);
                return -e;
        }
        setvbuf(stderr, NULL, _IOLBF, 0); /* one write per line, so lines reach the pipe whole */
        if (dup2(p[1], STDERR_FILENO) < 0) {
                int err = errno;
                close(p[1]);
                pthread_detach(l->th);
                return -err;
        }
        close(p[1]);
        *ret = l;
        return 0;
}

void kfs_log_finish(struct kfs_log *l)
{
        if (!l)
                return;
        fflush(stderr);
        int null = open("/dev/null", O_WRONLY | O_CLOEXEC);
        if (null >= 0) { /* the pipe's last write end goes: the thread reads what is left, then EOF */
                dup2(null, STDERR_FILENO);
                close(null);
        }
        pthread_join(l->th, NULL);
        close(l->rfd);
        closelog();
        free(l);
}
