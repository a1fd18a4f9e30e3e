/* log.c: where the daemon's messages go, each with the priority its caller gave.
 *
 * kfs_log(PRIORITY, ...) is how the daemon speaks: LOG_ERR (something failed), LOG_WARNING (something is
 * off and the daemon carries on), LOG_NOTICE (a change an operator should know of), LOG_INFO (routine).
 * libfuse's own messages come through fuse_set_log_func with theirs (FUSE_LOG_* are syslog's levels).
 * Until kfs_log_start() a message goes to stderr as "kcachefs: MESSAGE" ("kcachefs: warning: MESSAGE" at
 * LOG_WARNING), as everything before the mount does: the operator's terminal, or the journal where
 * systemd runs the daemon in the foreground, which then gets each line's priority as a "<N>" prefix
 * (sd-daemon(3)) when stderr is the stream systemd named in $JOURNAL_STREAM.
 *
 * From kfs_log_start() on (a detached daemon, -o log=, or in the foreground under systemd where the journal
 * answers), messages go to one sink, the first of:
 *   - a file (-o log=FILE, or the fallback below): appended, one line each, "TIME kcachefs[PID] PRIORITY:
 *     MESSAGE" with TIME in UTC to the millisecond;
 *   - the journal, where its socket answers (/run/systemd/journal/socket): sd_journal_send, each message
 *     with PRIORITY, SYSLOG_IDENTIFIER=kcachefs, SYSLOG_FACILITY (daemon) and MOUNT (the mount point), so
 *     that journalctl MOUNT=/path shows one mount's messages; a message the journal refuses goes to syslog;
 *   - syslog (facility daemon), where its socket answers;
 *   - where neither answers (containers, minimal HPC images have no /dev/log) and no log=, the
 *     caller opens BACKING_DIR/.kcachefs/kcachefs.log through the tree door, and the first message says
 *     where messages go, so that they never vanish unseen.
 * Whatever else writes to stderr (the index, SQLite, code that names no priority) is caught by a pipe: a
 * thread reads it line by line and passes each line on at LOG_WARNING, since such code writes only when
 * something went wrong. No priority is guessed from a message's words.
 *
 * RATE. A failure that repeats (a full disk under every write) must not flood the log: a bucket of
 * LOG_BURST lines refills at one line per LOG_REFILL_S seconds; lines beyond it are counted, and the next
 * line that passes says how many were dropped. The pipe's write end never blocks: if its thread falls
 * behind by a pipe's worth (64 KiB), further lines are lost rather than stall a request.
 *
 * STATE. The sink is process-wide, as stderr and syslog's connection are: one struct, set up once by
 * kfs_log_start() and torn down by kfs_log_finish(), reached through `sink` under sink_lock (a leaf: no
 * other lock is taken under it). It is the daemon's one mutable global, for the same reason stderr is. */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <syslog.h>
#include <time.h>
#include <unistd.h>

#define SD_JOURNAL_SUPPRESS_LOCATION /* every message would name emit() */
#include <systemd/sd-journal.h>

#include "kfs.h"

#define LOG_BURST 20
#define LOG_REFILL_S 5
#define LOG_DRAIN_S 5 /* at exit, for the messages still in the pipe (kfs_log_finish) */

struct kfs_log { /* lives from kfs_log_start() to kfs_log_finish() */
        int rfd;                /* the stderr pipe's read end */
        int stopfd;             /* an eventfd: kfs_log_finish's word to stop without the pipe's EOF */
        int file;               /* the file appended to; -1: the journal or syslog */
        char *mount;            /* the journal's MOUNT field; NULL: syslog (or the file) */
        pthread_t th;
        double tokens;          /* sink_lock */
        struct timespec last;   /* sink_lock */
        unsigned long dropped;  /* sink_lock */
};

static pthread_mutex_t sink_lock = PTHREAD_MUTEX_INITIALIZER;
static struct kfs_log *sink; /* sink_lock */
static bool to_journal; /* stderr is systemd's journal stream: set by kfs_log_init, before any thread */

static const char *prio_name(int prio)
{
        switch (prio) {
        case LOG_EMERG: return "emerg";
        case LOG_ALERT: return "alert";
        case LOG_CRIT: return "crit";
        case LOG_ERR: return "err";
        case LOG_WARNING: return "warning";
        case LOG_NOTICE: return "notice";
        case LOG_INFO: return "info";
        default: return "debug";
        }
}

/* One line to the sink's file: written whole in one write(2), so that lines of two threads never mix. */
static void file_line(int fd, int prio, const char *msg)
{
        struct timespec ts;
        struct tm tm;
        char stamp[64], line[4608];
        clock_gettime(CLOCK_REALTIME, &ts);
        gmtime_r(&ts.tv_sec, &tm);
        strftime(stamp, sizeof(stamp), "%Y-%m-%dT%H:%M:%S", &tm);
        int n = snprintf(line, sizeof(line), "%s.%03ldZ kcachefs[%ld] %s: %s\n", stamp, ts.tv_nsec / 1000000,
                         (long)getpid(), prio_name(prio), msg);
        if (n < 0)
                return;
        if ((size_t)n >= sizeof(line)) {
                n = (int)sizeof(line) - 1;
                line[n - 1] = '\n';
        }
        if (write(fd, line, (size_t)n) < 0) {
                /* nowhere left to say it */
        }
}

/* One message to the sink: its file, the journal (syslog if the journal refuses it), or syslog. */
static void sink_line(struct kfs_log *l, int prio, const char *msg)
{
        if (l->file >= 0)
                file_line(l->file, prio, msg);
        else if (!l->mount || sd_journal_send("MESSAGE=%s", msg, "PRIORITY=%d", prio & LOG_PRIMASK,
                                               "SYSLOG_IDENTIFIER=kcachefs", "SYSLOG_FACILITY=%d", LOG_DAEMON >> 3,
                                               "MOUNT=%s", l->mount, NULL) < 0)
                syslog(prio, "%s", msg);
}

/* sink_lock held. */
static void emit(struct kfs_log *l, int prio, const char *msg)
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
                char note[128];
                snprintf(note, sizeof(note), "%lu messages dropped (more than %d at once)", l->dropped, LOG_BURST);
                sink_line(l, LOG_WARNING, note);
                l->dropped = 0;
        }
        if (!strncmp(msg, "kcachefs: ", 10))
                msg += 10; /* the sink names us already */
        sink_line(l, prio, msg);
}

static void vlog(int prio, const char *fmt, va_list ap)
{
        pthread_mutex_lock(&sink_lock);
        if (sink) {
                char msg[4096];
                vsnprintf(msg, sizeof(msg), fmt, ap);
                size_t n = strlen(msg);
                while (n > 0 && msg[n - 1] == '\n')
                        msg[--n] = '\0';
                emit(sink, prio, msg);
        } else { /* one write, so that lines of two threads never mix */
                char msg[4096];
                int n = vsnprintf(msg, sizeof(msg), fmt, ap);
                char level[8] = "";
                if (to_journal) /* "<N>": the journal takes the line's priority from it (sd-daemon(3)) */
                        snprintf(level, sizeof(level), "<%d>", prio & LOG_PRIMASK);
                if (n >= 0) /* on a terminal the priority is a word, where it is one to heed */
                        fprintf(stderr, "%skcachefs: %s%s%s", level, prio == LOG_WARNING ? "warning: " : "", msg,
                                n > 0 && msg[n - 1] == '\n' ? "" : "\n");
        }
        pthread_mutex_unlock(&sink_lock);
}

void kfs_log(int prio, const char *fmt, ...)
{
        va_list ap;
        va_start(ap, fmt);
        vlog(prio, fmt, ap);
        va_end(ap);
}

/* libfuse's messages, with libfuse's priority (enum fuse_log_level is syslog's levels). */
static void fuse_log_fn(enum fuse_log_level level, const char *fmt, va_list ap)
{
        vlog((int)level, fmt, ap);
}

void kfs_log_init(void)
{
        /* systemd names the journal stream it gave us as "DEV:INO" (systemd.exec(5), $JOURNAL_STREAM); a
         * stderr redirected elsewhere since is not it, and gets no prefix. */
        const char *js = getenv("JOURNAL_STREAM");
        unsigned long long dev, ino;
        struct stat st;
        if (js && sscanf(js, "%llu:%llu", &dev, &ino) == 2 && fstat(STDERR_FILENO, &st) == 0)
                to_journal = (unsigned long long)st.st_dev == dev && (unsigned long long)st.st_ino == ino;
        fuse_set_log_func(fuse_log_fn);
}

bool kfs_log_journal_stream(void)
{
        return to_journal;
}

bool kfs_log_journal_answers(void)
{
        const char *path = getenv("KCACHEFS_JOURNAL_SOCKET"); /* tests only: where none is */
        return kfs_log_syslog_answers(path && *path ? path : "/run/systemd/journal/socket");
}

bool kfs_log_syslog_answers(const char *path)
{
        struct sockaddr_un sa = { .sun_family = AF_UNIX };
        if (strlen(path) >= sizeof(sa.sun_path))
                return false;
        strcpy(sa.sun_path, path);
        static const int types[] = { SOCK_DGRAM, SOCK_STREAM }; /* glibc's syslog tries both */
        for (size_t i = 0; i < 2; i++) {
                int fd = socket(AF_UNIX, types[i] | SOCK_CLOEXEC, 0);
                if (fd < 0)
                        continue;
                int r = connect(fd, (struct sockaddr *)&sa, sizeof(sa));
                close(fd);
                if (r == 0)
                        return true;
        }
        return false;
}

static void *log_main(void *arg)
{
        struct kfs_log *l = arg;
        char buf[4096];
        size_t have = 0;
        for (;;) {
                struct pollfd pf[2] = { { .fd = l->rfd, .events = POLLIN }, { .fd = l->stopfd, .events = POLLIN } };
                if (poll(pf, 2, -1) < 0) {
                        if (errno == EINTR)
                                continue;
                        break;
                }
                if (!(pf[0].revents & (POLLIN | POLLHUP | POLLERR)))
                        break; /* told to stop, and nothing is left to read */
                ssize_t n = read(l->rfd, buf + have, sizeof(buf) - 1 - have);
                if (n < 0 && errno == EINTR)
                        continue;
                if (n <= 0)
                        break;
                have += (size_t)n;
                buf[have] = '\0';
                char *p = buf, *nl;
                pthread_mutex_lock(&sink_lock);
                while ((nl = strchr(p, '\n'))) {
                        *nl = '\0';
                        if (*p)
                                emit(l, LOG_WARNING, p);
                        p = nl + 1;
                }
                have = (size_t)(buf + have - p);
                memmove(buf, p, have);
                if (have == sizeof(buf) - 1) { /* a line longer than the buffer: cut */
                        buf[have] = '\0';
                        emit(l, LOG_WARNING, buf);
                        have = 0;
                }
                pthread_mutex_unlock(&sink_lock);
        }
        return NULL;
}

int kfs_log_start(int file, const char *journal_mount, const char *note, struct kfs_log **ret)
{
        int p[2];
        if (pipe2(p, O_CLOEXEC) < 0) {
                int e = errno;
                if (file >= 0)
                        close(file);
                return -e;
        }
        struct kfs_log *l = calloc(1, sizeof(*l));
        if (!l) {
                close(p[0]);
                close(p[1]);
                if (file >= 0)
                        close(file);
                return -ENOMEM;
        }
        l->rfd = p[0];
        l->file = file;
        l->stopfd = eventfd(0, EFD_CLOEXEC);
        if (l->stopfd < 0 || (file < 0 && journal_mount && !(l->mount = strdup(journal_mount)))) {
                int e = l->stopfd < 0 ? errno : ENOMEM;
                if (l->stopfd >= 0)
                        close(l->stopfd);
                close(p[0]);
                close(p[1]);
                if (file >= 0)
                        close(file);
                free(l);
                return -e;
        }
        l->tokens = LOG_BURST;
        clock_gettime(CLOCK_MONOTONIC, &l->last);
        if (file < 0) /* the journal's fallback too */
                openlog("kcachefs", LOG_PID | (journal_mount ? 0 : LOG_NDELAY), LOG_DAEMON);
        (void)fcntl(p[1], F_SETFL, O_NONBLOCK);
        sigset_t all, old;
        sigfillset(&all);
        pthread_sigmask(SIG_BLOCK, &all, &old);
        int e = pthread_create(&l->th, NULL, log_main, l);
        pthread_sigmask(SIG_SETMASK, &old, NULL);
        if (e != 0) {
                close(p[0]);
                close(p[1]);
                close(l->stopfd);
                if (file >= 0)
                        close(file);
                free(l->mount);
                free(l);
                return -e;
        }
        fflush(stderr);
        setvbuf(stderr, NULL, _IOLBF, 0); /* one write per line, so lines reach the pipe whole */
        if (dup2(p[1], STDERR_FILENO) < 0) {
                int err = errno;
                close(p[1]);
                pthread_detach(l->th); /* it ends at EOF; l stays, as the process does */
                return -err;
        }
        close(p[1]);
        pthread_mutex_lock(&sink_lock);
        sink = l;
        pthread_mutex_unlock(&sink_lock);
        if (note)
                kfs_log(LOG_NOTICE, "%s", note);
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
        /* A helper process still running holds a copy of the write end (spawn.c: a nudge stuck in its
         * statfs, ring.c), and then no EOF comes: after LOG_DRAIN_S the thread is told to stop once the pipe
         * holds nothing more, and joined, so that no thread of ours is left running as the process exits
         * (LeakSanitizer's tracer faults on one: CI's sanitizer pass, with the test of this). */
        struct timespec until;
        clock_gettime(CLOCK_REALTIME, &until);
        until.tv_sec += LOG_DRAIN_S;
        if (pthread_timedjoin_np(l->th, NULL, &until) != 0) {
                uint64_t one = 1;
                (void)!write(l->stopfd, &one, sizeof(one));
                pthread_join(l->th, NULL);
        }
        pthread_mutex_lock(&sink_lock);
        sink = NULL;
        pthread_mutex_unlock(&sink_lock);
        close(l->rfd);
        close(l->stopfd);
        if (l->file >= 0)
                close(l->file);
        else
                closelog();
        free(l->mount);
        free(l);
}
