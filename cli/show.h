/* kcache show: decodes libkcache entries (show.c). */
#pragma once
/* Shows each of the n files. Returns 0 if every entry is sound, 1 if one is not or cannot be read. */
int kc_show(int n, char **files);
