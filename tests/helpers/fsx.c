/* fsx: a file system exerciser in the manner of the classic fsx. Random writes, extending writes,
 * truncates (down and up), mmap writes, reads, fallocate, fsync and reopen on a few files, each
 * checked against a shadow copy in memory: every read is compared, and every file whole every 10,000
 * operations and at the end.
 *
 *   fsx DIR [OPS [SEED]]     (OPS default 1000000)
 *
 * On a mismatch it prints the offset, both bytes, and the last 32 operations, and exits 1. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#define NFILES 4
#define MAXLEN (1 << 20)
#define MAXIO (64 << 10)

struct file {
        int fd;
        char path[4200];
        uint8_t *shadow;
        size_t len;
};

static struct file F[NFILES];
static uint64_t rng;
static char hist[32][96];
static long nops;

static uint64_t rnd(void)
{
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        return rng;
}

/* Random bytes, eight per step of the generator. */
static void fill(uint8_t *p, size_t n)
{
        size_t i = 0;
        for (; i + 8 <= n; i += 8) {
                uint64_t v = rnd();
                memcpy(p + i, &v, 8);
        }
        for (; i < n; i++)
                p[i] = (uint8_t)(rnd() >> 24);
}

/* Records operation nops in the ring of the last 32. */
#define NOTE(f, fmt, ...) snprintf(hist[nops % 32], sizeof(hist[0]), "%ld: file %d " fmt, nops, f, ##__VA_ARGS__)

static void fail(const char *what, int f)
{
        fprintf(stderr, "fsx: %s on file %d (%s) after %ld operations (errno: %s); last operations:\n", what, f,
                F[f].path, nops, strerror(errno));
        for (long i = nops - 31 > 0 ? nops - 31 : 0; i <= nops; i++)
                fprintf(stderr, "  %s\n", hist[i % 32]);
        exit(1);
}

/* Moves [off, off+len) inside the file (which must not be empty: false if it is). */
static bool inside(const struct file *x, size_t *off, size_t *len)
{
        if (!x->len)
                return false;
        *off %= x->len;
        if (*off + *len > x->len)
                *len = x->len - *off;
        return true;
}

static void check_range(int f, const uint8_t *got, size_t off, size_t len, const char *how)
{
        if (!memcmp(got, F[f].shadow + off, len))
                return;
        for (size_t i = 0; i < len; i++)
                if (got[i] != F[f].shadow[off + i]) {
                        fprintf(stderr, "fsx: %s mismatch at offset %zu: file 0x%02x, expected 0x%02x\n", how, off + i,
                                got[i], F[f].shadow[off + i]);
                        break;
                }
        fail("data mismatch", f);
}

static void verify_whole(int f)
{
        struct stat st;
        if (fstat(F[f].fd, &st) < 0)
                fail("fstat", f);
        if ((size_t)st.st_size != F[f].len) {
                fprintf(stderr, "fsx: size %lld, expected %zu\n", (long long)st.st_size, F[f].len);
                fail("size mismatch", f);
        }
        static uint8_t buf[MAXLEN];
        ssize_t n = pread(F[f].fd, buf, F[f].len, 0);
        if (n != (ssize_t)F[f].len)
                fail("short whole-file read", f);
        check_range(f, buf, 0, F[f].len, "whole-file");
}

int main(int argc, char **argv)
{
        if (argc < 2) {
                fprintf(stderr, "usage: fsx DIR [OPS [SEED]]\n");
                return 2;
        }
        long ops = argc > 2 ? atol(argv[2]) : 1000000;
        rng = argc > 3 ? strtoull(argv[3], NULL, 0) : 0x9e3779b97f4a7c15ull;
        if (!rng)
                rng = 1;
        static uint8_t buf[MAXIO];
        for (int f = 0; f < NFILES; f++) {
                snprintf(F[f].path, sizeof(F[f].path), "%s/fsx.%d", argv[1], f);
                F[f].fd = open(F[f].path, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
                F[f].shadow = calloc(1, MAXLEN);
                if (F[f].fd < 0 || !F[f].shadow)
                        fail("open", f);
        }
        long counts[9] = { 0 };
        for (nops = 0; nops < ops; nops++) {
                int f = (int)(rnd() % NFILES);
                struct file *x = &F[f];
                unsigned op = (unsigned)(rnd() % 100);
                size_t off = (size_t)(rnd() % MAXLEN), len = (size_t)(rnd() % MAXIO) + 1;
                if (off + len > MAXLEN)
                        len = MAXLEN - off;
                if (op < 30) { /* write, anywhere (past the end: extends, with a hole) */
                        fill(buf, len);
                        NOTE(f, "write %zu+%zu", off, len);
                        if (pwrite(x->fd, buf, len, (off_t)off) != (ssize_t)len)
                                fail("write", f);
                        memcpy(x->shadow + off, buf, len);
                        if (off + len > x->len)
                                x->len = off + len;
                        counts[0]++;
                } else if (op < 65) { /* read */
                        if (!inside(x, &off, &len))
                                continue;
                        NOTE(f, "read %zu+%zu", off, len);
                        if (pread(x->fd, buf, len, (off_t)off) != (ssize_t)len)
                                fail("short read", f);
                        check_range(f, buf, off, len, "read");
                        counts[1]++;
                } else if (op < 73) { /* truncate, down or up */
                        size_t nl = (size_t)(rnd() % MAXLEN);
                        NOTE(f, "truncate %zu (was %zu)", nl, x->len);
                        if (ftruncate(x->fd, (off_t)nl) < 0)
                                fail("truncate", f);
                        if (nl < x->len)
                                memset(x->shadow + nl, 0, x->len - nl);
                        x->len = nl;
                        counts[2]++;
                } else if (op < 81) { /* mmap write inside the file */
                        if (!inside(x, &off, &len))
                                continue;
                        size_t pg = (size_t)sysconf(_SC_PAGESIZE), base = off / pg * pg;
                        NOTE(f, "mmap write %zu+%zu", off, len);
                        uint8_t *m = mmap(NULL, off + len - base, PROT_READ | PROT_WRITE, MAP_SHARED, x->fd, (off_t)base);
                        if (m == MAP_FAILED)
                                fail("mmap", f);
                        fill(x->shadow + off, len);
                        memcpy(m + (off - base), x->shadow + off, len);
                        if (rnd() % 2 && msync(m, off + len - base, MS_SYNC) < 0)
                                fail("msync", f);
                        munmap(m, off + len - base);
                        counts[3]++;
                } else if (op < 86) { /* fallocate: allocate, keeping or extending the size */
                        int keep = (int)(rnd() % 2);
                        NOTE(f, "fallocate%s %zu+%zu", keep ? " keep_size" : "", off, len);
                        if (fallocate(x->fd, keep ? FALLOC_FL_KEEP_SIZE : 0, (off_t)off, (off_t)len) < 0) {
                                if (errno == EOPNOTSUPP)
                                        continue;
                                fail("fallocate", f);
                        }
                        if (!keep && off + len > x->len)
                                x->len = off + len;
                        counts[4]++;
                } else if (op < 90) { /* fallocate punching a hole */
                        if (!inside(x, &off, &len))
                                continue;
                        NOTE(f, "punch hole %zu+%zu", off, len);
                        if (fallocate(x->fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, (off_t)off, (off_t)len) < 0) {
                                if (errno == EOPNOTSUPP)
                                        continue;
                                fail("punch hole", f);
                        }
                        memset(x->shadow + off, 0, len);
                        counts[5]++;
                } else if (op < 94) { /* close and reopen (open/release; cached pages kept or not) */
                        NOTE(f, "reopen");
                        close(x->fd);
                        x->fd = open(x->path, O_RDWR | O_CLOEXEC);
                        if (x->fd < 0)
                                fail("reopen", f);
                        counts[6]++;
                } else if (op < 96) {
                        NOTE(f, "fsync");
                        if ((rnd() % 2 ? fsync(x->fd) : fdatasync(x->fd)) < 0)
                                fail("fsync", f);
                        counts[7]++;
                } else { /* stat: the size the kernel reports */
                        struct stat st;
                        NOTE(f, "stat");
                        if (stat(x->path, &st) < 0 || (size_t)st.st_size != x->len)
                                fail("stat size", f);
                        counts[8]++;
                }
                if (nops % 10000 == 9999)
                        verify_whole(f);
        }
        for (int f = 0; f < NFILES; f++) {
                verify_whole(f);
                close(F[f].fd); /* and once more through a fresh open */
                F[f].fd = open(F[f].path, O_RDONLY | O_CLOEXEC);
                verify_whole(f);
                close(F[f].fd);
        }
        printf("fsx: %ld operations, no mismatch: %ld writes, %ld reads, %ld truncates, %ld mmap writes, "
               "%ld fallocates, %ld holes, %ld reopens, %ld fsyncs, %ld stats\n",
               ops, counts[0], counts[1], counts[2], counts[3], counts[4], counts[5], counts[6], counts[7], counts[8]);
        return 0;
}
