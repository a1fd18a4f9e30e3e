/* kbench: the timed operations of bench/run, in C so that the measurement is the filesystem's cost and
 * not an interpreter's. Each invocation runs one operation once over one directory and prints seconds.
 *
 *   kbench populate DIR            2,000 files of 64 KiB and 200 of 1 MiB in DIR/xx/yy/ (hashed)
 *   kbench read DIR                open + read all + close every file
 *   kbench hit DIR                 a runtime's hit of every file: open + fstat (for the size) + read to
 *                                  the end + close
 *   kbench neohit DIR              NEO's hit: open + lseek(SEEK_END) (the size) + lseek(0) + read + close
 *   kbench stat DIR                stat every file
 *   kbench readdir DIR             walk the tree, names only
 *   kbench walkstat DIR            walk the tree and fstatat every entry (as du does)
 *   kbench publish DIR TAG N [CHUNK]  N new 256 KiB files by temp + write + rename into DIR/pub-TAG/,
 *                                  in writes of CHUNK bytes (default: one write)
 *   kbench parread DIR P           P processes each read every file, concurrently
 *   kbench writelat DIR N          N 64 KiB temp+write+rename publications; prints the worst latency
 *   kbench many DIR N              N files of 1 byte in DIR/dNNNN/ (1,000 per directory), for the index;
 *                                  creates those missing, prints how many
 *   kbench bigwrite FILE KIB       one write(2) of KIB KiB into a new FILE; prints its duration
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define N_SMALL 2000
#define N_BIG 200
#define N_FILES (N_SMALL + N_BIG)

static double now(void)
{
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static void die(const char *what, const char *path)
{
        fprintf(stderr, "kbench: %s %s: %s\n", what, path, strerror(errno));
        exit(1);
}

static uint32_t mix(uint32_t x)
{
        x ^= x >> 16;
        x *= 0x7feb352d;
        x ^= x >> 15;
        x *= 0x846ca68b;
        x ^= x >> 16;
        return x;
}

static void file_path(char *buf, size_t size, const char *dir, int i)
{
        uint32_t h = mix((uint32_t)i + 1);
        snprintf(buf, size, "%s/%02x/%02x/%08x%s", dir, h & 0x0f, (h >> 8) & 0x0f, h, i < N_SMALL ? ".bin" : ".big");
}

static size_t file_size(int i)
{
        return i < N_SMALL ? 64 * 1024 : 1024 * 1024;
}

static char *buffer(void)
{
        static char *b;
        if (!b) {
                b = malloc(1 << 20);
                for (int i = 0; i < 1 << 20; i++)
                        b[i] = (char)(i * 31 + 7);
        }
        return b;
}

static void mkdirs(const char *dir)
{
        char p[4096];
        mkdir(dir, 0755);
        for (int a = 0; a < 16; a++) {
                snprintf(p, sizeof(p), "%s/%02x", dir, a);
                mkdir(p, 0755);
                for (int b = 0; b < 16; b++) {
                        snprintf(p, sizeof(p), "%s/%02x/%02x", dir, a, b);
                        mkdir(p, 0755);
                }
        }
}

static void populate(const char *dir)
{
        mkdirs(dir);
        char p[4096];
        for (int i = 0; i < N_FILES; i++) {
                file_path(p, sizeof(p), dir, i);
                int fd = open(p, O_WRONLY | O_CREAT | O_TRUNC, 0644);
                if (fd < 0 || write(fd, buffer(), file_size(i)) != (ssize_t)file_size(i))
                        die("write", p);
                close(fd);
        }
}

/* How each file's size is taken before it is read to the end: not at all (open, read, close), by fstat
 * (a runtime's hit), or by lseek(SEEK_END) and back (NEO's). A size taken must match what was read. */
enum size_by { SIZE_NONE, SIZE_FSTAT, SIZE_LSEEK };

static void read_all(const char *dir, enum size_by how)
{
        char p[4096], *b = buffer();
        for (int i = 0; i < N_FILES; i++) {
                file_path(p, sizeof(p), dir, i);
                int fd = open(p, O_RDONLY);
                if (fd < 0)
                        die("open", p);
                off_t size = -1;
                struct stat st;
                if (how == SIZE_LSEEK) {
                        size = lseek(fd, 0, SEEK_END);
                        if (size < 0 || lseek(fd, 0, SEEK_SET) < 0)
                                die("lseek", p);
                } else if (how == SIZE_FSTAT) {
                        if (fstat(fd, &st) < 0)
                                die("fstat", p);
                        size = st.st_size;
                }
                off_t got = 0;
                ssize_t n;
                while ((n = read(fd, b, 1 << 20)) > 0)
                        got += n;
                if (n < 0 || (how != SIZE_NONE && got != size))
                        die("read", p);
                close(fd);
        }
}

static void stat_all(const char *dir)
{
        char p[4096];
        struct stat st;
        for (int i = 0; i < N_FILES; i++) {
                file_path(p, sizeof(p), dir, i);
                if (stat(p, &st) < 0)
                        die("stat", p);
        }
}

static long walk(int dfd, int with_stat)
{
        DIR *d = fdopendir(dfd);
        if (!d)
                die("fdopendir", "");
        long n = 0;
        struct dirent *de;
        while ((de = readdir(d))) {
                if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, ".."))
                        continue;
                n++;
                struct stat st;
                if (with_stat && fstatat(dirfd(d), de->d_name, &st, AT_SYMLINK_NOFOLLOW) < 0)
                        die("fstatat", de->d_name);
                if (de->d_type == DT_DIR) {
                        int c = openat(dirfd(d), de->d_name, O_RDONLY | O_DIRECTORY);
                        if (c < 0)
                                die("openat", de->d_name);
                        n += walk(c, with_stat);
                }
        }
        closedir(d);
        return n;
}

static void publish(const char *dir, const char *tag, int n, double *worst, size_t chunk)
{
        char base[4096], tmp[4300], fin[4200];
        snprintf(base, sizeof(base), "%s/pub-%s", dir, tag);
        mkdirs(base);
        size_t size = worst ? 64 * 1024 : 256 * 1024;
        for (int i = 0; i < n; i++) {
                double t0 = now();
                file_path(fin, sizeof(fin), base, i);
                snprintf(tmp, sizeof(tmp), "%s.tmp.%d", fin, getpid());
                int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL, 0644);
                if (fd < 0)
                        die("open", tmp);
                for (size_t done = 0, step = chunk && chunk < size ? chunk : size; done < size; done += step)
                        if (write(fd, buffer() + done, step) != (ssize_t)step)
                                die("write", tmp);
                close(fd);
                if (rename(tmp, fin) < 0)
                        die("rename", fin);
                double dt = now() - t0;
                if (worst && dt > *worst)
                        *worst = dt;
        }
}

int main(int argc, char **argv)
{
        if (argc < 3) {
                fprintf(stderr, "usage: kbench OP DIR [ARGS]\n");
                return 2;
        }
        const char *op = argv[1], *dir = argv[2];
        double t0 = now();
        if (!strcmp(op, "populate")) {
                populate(dir);
        } else if (!strcmp(op, "read")) {
                read_all(dir, SIZE_NONE);
        } else if (!strcmp(op, "hit") || !strcmp(op, "neohit")) {
                read_all(dir, !strcmp(op, "neohit") ? SIZE_LSEEK : SIZE_FSTAT);
        } else if (!strcmp(op, "stat")) {
                stat_all(dir);
        } else if (!strcmp(op, "readdir") || !strcmp(op, "walkstat")) {
                int fd = open(dir, O_RDONLY | O_DIRECTORY);
                if (fd < 0)
                        die("open", dir);
                walk(fd, !strcmp(op, "walkstat"));
        } else if (!strcmp(op, "publish") && (argc == 5 || argc == 6)) {
                publish(dir, argv[3], atoi(argv[4]), NULL, argc == 6 ? (size_t)atol(argv[5]) : 0);
        } else if (!strcmp(op, "writelat") && argc == 4) {
                double worst = 0;
                publish(dir, "lat", atoi(argv[3]), &worst, 0);
                printf("%.6f\n", worst);
                return 0;
        } else if (!strcmp(op, "many") && argc == 4) {
                long n = atol(argv[3]), made = 0;
                char p[4096];
                mkdir(dir, 0755);
                for (long i = 0; i < n; i++) {
                        if (i % 1000 == 0) {
                                snprintf(p, sizeof(p), "%s/d%04ld", dir, i / 1000);
                                mkdir(p, 0755);
                        }
                        snprintf(p, sizeof(p), "%s/d%04ld/f%07ld", dir, i / 1000, i);
                        int fd = open(p, O_WRONLY | O_CREAT | O_EXCL, 0644);
                        if (fd < 0 && errno == EEXIST)
                                continue; /* tops up a tree that earlier runs' evictions thinned */
                        if (fd < 0 || write(fd, "x", 1) != 1)
                                die("write", p);
                        close(fd);
                        made++;
                }
                printf("%ld\n", made);
                return 0;
        } else if (!strcmp(op, "bigwrite") && argc == 4) {
                size_t len = (size_t)atol(argv[3]) * 1024;
                char *b = malloc(len);
                /* Data, as a real writer has: Linux 6.18 splits a write(2) from never-touched memory at an
                 * address that is not page-aligned (calloc's) into one FUSE request per page. */
                if (b)
                        memset(b, 0x5a, len);
                int fd = open(dir, O_WRONLY | O_CREAT | O_EXCL, 0644);
                if (fd < 0)
                        die("open", dir);
                double t1 = now();
                if (write(fd, b, len) != (ssize_t)len)
                        die("write", dir);
                printf("%.6f\n", now() - t1);
                close(fd);
                return 0;
        } else if (!strcmp(op, "parread") && argc == 4) {
                int p = atoi(argv[3]);
                for (int i = 0; i < p; i++)
                        if (fork() == 0) {
                                read_all(dir, SIZE_NONE);
                                _exit(0);
                        }
                int st, bad = 0;
                while (wait(&st) > 0)
                        bad |= !WIFEXITED(st) || WEXITSTATUS(st);
                if (bad)
                        return 1;
        } else {
                fprintf(stderr, "kbench: unknown operation %s\n", op);
                return 2;
        }
        printf("%.6f\n", now() - t0);
        return 0;
}
