/* libFuzzer target: the daemon's option parsing (fuse_opt with kcachefs's table, then sizes, pin lists
 * and layouts) on arbitrary command lines. The input's NUL or newline bytes separate arguments. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "../../fs/kfs.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
        char *buf = malloc(size + 1);
        memcpy(buf, data, size);
        buf[size] = '\0';
        char *argv[34] = { "kcachefs" };
        int argc = 1;
        for (char *p = buf; argc < 33 && p <= buf + size;) {
                size_t l = strcspn(p, "\n");
                p[l] = '\0';
                argv[argc++] = p;
                p += l + 1;
        }
        struct fuse_args args = FUSE_ARGS_INIT(argc, argv);
        struct kfs_opts o = { 0 };
        if (kfs_opts_parse(&args, &o) == 0) {
                char why[512];
                (void)kfs_opts_check(&o, "1G", why, sizeof(why));
                if (o.pin_str && kfs_parse_pins(o.pin_str, &o.pins) < 0)
                        o.pins = NULL;
                if (o.layout_str && kfs_parse_layouts(o.layout_str, &o.layouts, &o.nlayouts) < 0)
                        o.nlayouts = 0, o.layouts = NULL;
        }
        kfs_free_opts(&o);
        fuse_opt_free_args(&args);
        free(buf);
        return 0;
}
