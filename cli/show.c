/* kcache show FILE...: decodes libkcache entries (see client/kcache-entry.h): the key's fields, the
 * sizes, and whether the entry is whole and would be used (format, file name, checksums, owner).
 * Reads only; works on any entry file, in a mount or not. Its command line is kcache.c's (args.h). */
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <pwd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include "kcache-entry.h"
#include "show.h"

static void print_field(void *arg, int tag, const uint8_t *d, size_t len)
{
        (void)arg;
        bool text = true;
        for (size_t i = 0; i < len && text; i++)
                text = isprint(d[i]) || d[i] == '\n' || d[i] == '\t';
        const char *name = kcache__tag_name(tag);
        if ((tag == KCACHE__T_DEVICE_UUID || tag == KCACHE__T_DRIVER_UUID) && len <= 32) {
                printf("    %-17s ", name);
                for (size_t i = 0; i < len; i++)
                        printf("%02x", d[i]);
                printf("\n");
        } else if (tag == KCACHE__T_SPEC && len >= 4) {
                printf("    %-17s id %u =", name, d[0] | d[1] << 8 | d[2] << 16 | (unsigned)d[3] << 24);
                for (size_t i = 4; i < len; i++)
                        printf(" %02x", d[i]);
                printf("\n");
        } else if (tag == KCACHE__T_INPUT || !text || len > 120) {
                size_t lines = 0;
                for (size_t i = 0; i < len; i++)
                        lines += d[i] == '\n';
                printf("    %-17s %zu bytes%s, xxh3-64 %016llx\n", name, len, text ? "" : " (binary)",
                       (unsigned long long)XXH3_64bits(d, len));
                if (text && tag == KCACHE__T_INPUT) { /* the first line says what it is */
                        size_t l = strcspn((const char *)d, "\n");
                        printf("    %-17s %.*s%s\n", "", (int)(l > 100 ? 100 : l), (const char *)d, l > 100 ? "..." : "");
                        (void)lines;
                }
        } else {
                printf("    %-17s \"%.*s\"\n", name, (int)len, (const char *)d);
        }
}

static int show_one(const char *path)
{
        int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
        struct stat st;
        if (fd < 0 || fstat(fd, &st) < 0) {
                fprintf(stderr, "kcache: %s: %s\n", path, strerror(errno));
                if (fd >= 0)
                        close(fd);
                return 1;
        }
        if (!S_ISREG(st.st_mode) || st.st_size > (off_t)(KCACHE__ENTRY_HEADER + 2 * KCACHE__MAX_PART)) {
                fprintf(stderr, "kcache: %s: not a libkcache entry (%s)\n", path,
                        S_ISREG(st.st_mode) ? "too large" : "not a regular file");
                close(fd);
                return 1;
        }
        uint8_t *buf = malloc((size_t)st.st_size + 1);
        ssize_t n = buf ? pread(fd, buf, (size_t)st.st_size, 0) : -1;
        close(fd);
        if (n < 0) {
                fprintf(stderr, "kcache: %s: %s\n", path, strerror(errno));
                free(buf);
                return 1;
        }
        struct kcache__entry_view v;
        enum kcache__verdict verdict = kcache__entry_parse(buf, (size_t)n, NULL, 0, &v);
        printf("%s\n", path);
        if (verdict == KCACHE__FOREIGN || verdict == KCACHE__VERSION) {
                printf("  verdict           %s\n", kcache__verdict_str(verdict));
                free(buf);
                return 1;
        }
        int bad = verdict != KCACHE__OK;
        char hex[33];
        kcache__hash_hex(v.key_hash, hex);
        const char *base = strrchr(path, '/') ? strrchr(path, '/') + 1 : path;
        bool name_ok = strlen(base) == 36 && !strncmp(base, hex, 32) && !strcmp(base + 32, ".kce");
        printf("  format            libkcache entry v%d\n", KCACHE__ENTRY_VERSION);
        printf("  size              %lld bytes (header %d, key %zu, payload %zu)\n", (long long)st.st_size,
               KCACHE__ENTRY_HEADER, v.key_len, v.payload_len);
        printf("  key hash          %s (%s)\n", hex, name_ok ? "matches the file name" : "differs from the file name");
        bad |= !name_ok;
        if (v.key) {
                printf("  key record\n");
                if (kcache__key_walk(v.key, v.key_len, print_field, NULL) < 0) {
                        printf("    (malformed key record)\n");
                        bad = 1;
                }
        }
        if (v.payload)
                printf("  payload           %zu bytes, xxh3-64 %016llx (header says %016llx)\n", v.payload_len,
                       (unsigned long long)XXH3_64bits(v.payload, v.payload_len), (unsigned long long)v.checksum);
        struct passwd *pw = getpwuid(st.st_uid);
        bool trusted = (st.st_uid == geteuid() || st.st_uid == 0) && !(st.st_mode & (S_IWGRP | S_IWOTH));
        printf("  owner             %s (uid %u), mode %04o: %s\n", pw ? pw->pw_name : "?", (unsigned)st.st_uid,
               (unsigned)(st.st_mode & 07777),
               trusted ? "used by you" : (st.st_mode & (S_IWGRP | S_IWOTH)) ? "writable by others: never used"
                                                                            : "another user's: used only if you trust the uid");
        printf("  verdict           %s\n", verdict == KCACHE__OK && !name_ok ? "ok, but under another key's name"
                                                                             : kcache__verdict_str(verdict));
        free(buf);
        return bad;
}

int kc_show(int n, char **files)
{
        int bad = 0;
        for (int i = 0; i < n; i++) {
                if (i > 0)
                        printf("\n");
                bad |= show_one(files[i]);
        }
        return bad;
}
