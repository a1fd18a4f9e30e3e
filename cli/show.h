/* kcache show: decodes libkcache entries (show.c). */
#pragma once
int kc_show(int argc, char **argv);
