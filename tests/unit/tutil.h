/* tutil.h: a few helpers for the C unit tests: checks that report file:line and keep going, and
 * temporary directories that are removed afterwards. The test's exit status is the failure count. */
#pragma once

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

extern int tutil_failures;

#define CHECK(cond)                                                                             \
        do {                                                                                    \
                if (!(cond)) {                                                                  \
                        fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond); \
                        tutil_failures++;                                                       \
                }                                                                               \
        } while (0)

#define CHECK_EQ(a, b)                                                                               \
        do {                                                                                         \
                long long _a = (long long)(a), _b = (long long)(b);                                  \
                if (_a != _b) {                                                                      \
                        fprintf(stderr, "%s:%d: CHECK_EQ failed: %s = %lld, %s = %lld\n", __FILE__,  \
                                __LINE__, #a, _a, #b, _b);                                           \
                        tutil_failures++;                                                            \
                }                                                                                    \
        } while (0)

/* mkdtemp under $TMPDIR; returns a malloc'ed path. */
char *tutil_tmpdir(void);
/* rm -rf */
void tutil_rmrf(const char *path);
/* Writes size bytes to dir/name (creating parent dirs is the caller's job). Returns st_ino. */
uint64_t tutil_write_file(const char *dir, const char *name, size_t size);
int tutil_done(const char *name);
