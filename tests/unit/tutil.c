/* tutil.c: see tutil.h. */
#include "tutil.h"

#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

int tutil_failures;

char *tutil_tmpdir(void)
{
        const char *base = getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp";
        char *p = malloc(strlen(base) + 32);
        sprintf(p, "%s/kcachefs-test-XXXXXX", base);
        if (!mkdtemp(p)) {
                perror("mkdtemp");
                exit(99);
        }
        return p;
}

void tutil_rmrf(const char *path)
{
        char cmd[4096];
        snprintf(cmd, sizeof(cmd), "rm -rf '%s'", path);
        if (system(cmd) != 0)
                fprintf(stderr, "warning: could not remove %s\n", path);
}

uint64_t tutil_write_file(const char *dir, const char *name, size_t size)
{
        char path[4096];
        snprintf(path, sizeof(path), "%s/%s", dir, name);
        FILE *f = fopen(path, "wb");
        if (!f) {
                perror(path);
                exit(99);
        }
        for (size_t i = 0; i < size; i++)
                fputc((int)(i * 7 + 3) & 0xff, f);
        fclose(f);
        struct stat st;
        stat(path, &st);
        return st.st_ino;
}

int tutil_done(const char *name)
{
        if (tutil_failures)
                fprintf(stderr, "%s: %d check(s) failed\n", name, tutil_failures);
        else
                printf("%s: all checks passed\n", name);
        return tutil_failures ? 1 : 0;
}
