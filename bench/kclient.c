/* kclient: the hit path of libkcache, against a plain open+read of the same bytes.
 *
 *   kclient DIR [ROUNDS]
 *
 * Stores a 64 KiB and a 1 MiB entry under DIR, then times, per size and interleaved round by round:
 *   get   kcache_get (open, fstat, read, verify the key record and the XXH3-64 checksum, copy out)
 *   read  open + fstat + malloc + read-all + close + free of the entry file (what an application
 *         loading its own binary file does, with no verification)
 * Prints "size op median_us min_us max_us" lines for bench/client. */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/stat.h>
#include <unistd.h>

#include "kcache.h"

static double now_us(void)
{
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        return ts.tv_sec * 1e6 + ts.tv_nsec / 1e3;
}

static int cmp(const void *a, const void *b)
{
        double x = *(const double *)a, y = *(const double *)b;
        return x < y ? -1 : x > y;
}

/* The path of the entry: the one file under DIR/blob that kcache_put wrote for this size. */
static int find_entry(const char *dir, size_t size, char *out, size_t n)
{
        char cmd[4400];
        snprintf(cmd, sizeof(cmd), "find '%s/blob' -name '*.kce' -size +%zuc -size -%zuc", dir, size, size + 4096);
        FILE *p = popen(cmd, "r");
        if (!p || !fgets(out, (int)n, p))
                return -1;
        out[strcspn(out, "\n")] = '\0';
        pclose(p);
        return 0;
}

int main(int argc, char **argv)
{
        if (argc < 2) {
                fprintf(stderr, "usage: kclient DIR [ROUNDS]\n");
                return 2;
        }
        int rounds = argc > 2 ? atoi(argv[2]) : 2000;
        kcache *kc;
        if (kcache_open(argv[1], &kc) < 0)
                return 1;
        const size_t sizes[2] = { 64 << 10, 1 << 20 };
        char paths[2][4096];
        uint8_t *data = malloc(1 << 20);
        for (size_t i = 0; i < (1 << 20); i++)
                data[i] = (uint8_t)(i * 131);
        for (int s = 0; s < 2; s++) {
                char key[32];
                snprintf(key, sizeof(key), "bench-%zu", sizes[s]);
                if (kcache_put(kc, key, strlen(key), data, sizes[s]) < 0 || find_entry(argv[1], sizes[s], paths[s], 4096)) {
                        fprintf(stderr, "kclient: cannot store the %zu-byte entry\n", sizes[s]);
                        return 1;
                }
        }
        double *t = malloc(sizeof(double) * (size_t)rounds * 4);
        for (int r = 0; r < rounds; r++)
                for (int s = 0; s < 2; s++) {
                        char key[32];
                        snprintf(key, sizeof(key), "bench-%zu", sizes[s]);
                        void *got;
                        size_t glen;
                        double t0 = now_us();
                        if (kcache_get(kc, key, strlen(key), &got, &glen) < 0 || glen != sizes[s])
                                return 1;
                        double t1 = now_us();
                        kcache_free(got);
                        double t2 = now_us();
                        int fd = open(paths[s], O_RDONLY | O_CLOEXEC);
                        struct stat st;
                        fstat(fd, &st);
                        uint8_t *b = malloc((size_t)st.st_size);
                        ssize_t n, tot = 0;
                        while ((n = read(fd, b + tot, (size_t)(st.st_size - tot))) > 0)
                                tot += n;
                        close(fd);
                        free(b);
                        double t3 = now_us();
                        t[(s * 2 + 0) * rounds + r] = t1 - t0;
                        t[(s * 2 + 1) * rounds + r] = t3 - t2;
                }
        const char *names[2] = { "get", "read" };
        for (int s = 0; s < 2; s++)
                for (int o = 0; o < 2; o++) {
                        double *v = t + (s * 2 + o) * rounds;
                        qsort(v, (size_t)rounds, sizeof(double), cmp);
                        printf("%zu %s %.1f %.1f %.1f\n", sizes[s], names[o], v[rounds / 2], v[0], v[rounds - 1]);
                }
        kcache_close(kc);
        return 0;
}
