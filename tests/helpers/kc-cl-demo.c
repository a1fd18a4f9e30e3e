/* kc-cl-demo: an OpenCL application built on libkcache (kcache_cl.h), for tests and bench/.
 *
 *   kc-cl-demo [--dir DIR | --no-cache] [--source FILE] [--options OPTS] [--threads N] [--break]
 *
 * Built with -DKC_PLAIN it is cl-plain: the same application in plain OpenCL, not linked with
 * libkcache (clCreateProgramWithSource + clBuildProgram), for the OpenCL layer's tests.
 *
 * Builds the program (with N threads asking at once if --threads), launches every kernel in it by name
 * order with n = 4096 and local size 64, reads each result back, and prints one JSON line: times (ms
 * since start), a checksum of all results, the handle's counters, the build error and log if any.
 * --break appends a syntax error to the source. Exit status: 0 ok, 1 build failed, 2 usage/setup. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#ifdef KC_PLAIN
#define CL_TARGET_OPENCL_VERSION 300
#include <CL/cl.h>
typedef struct kcache kcache;
struct kcache_stats {
        unsigned long long hits, misses, rejects, stores, store_errors, compiles, memory_hits, lock_waits, refreshes;
};
static int kcache_open(const char *d, kcache **k) { (void)d; *k = NULL; return 0; }
static void kcache_close(kcache *k) { (void)k; }
static void kcache_get_stats(const kcache *k, struct kcache_stats *s) { (void)k; memset(s, 0, sizeof(*s)); }
static const char *kcache_strerror(int e) { (void)e; return ""; }
static cl_program kcache_cl_build_program(kcache *kc, cl_context ctx, cl_uint ndev, const cl_device_id *devs,
                                          const char *src, size_t len, const char *options, cl_int *err)
{
        (void)kc;
        cl_program p = clCreateProgramWithSource(ctx, 1, &src, &len, err);
        if (p)
                *err = clBuildProgram(p, ndev, devs, options, NULL, NULL);
        return p;
}
#else
#include "kcache_cl.h"
#endif

#define N 4096

static double t_start;

static double now_ms(void)
{
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6 - t_start;
}

static char *slurp(const char *path, size_t *len)
{
        FILE *f = fopen(path, "rb");
        if (!f)
                return NULL;
        fseek(f, 0, SEEK_END);
        long n = ftell(f);
        rewind(f);
        char *b = malloc((size_t)n + 256); /* room for --break */
        if (b && fread(b, 1, (size_t)n, f) != (size_t)n) {
                free(b);
                b = NULL;
        }
        fclose(f);
        if (b)
                b[n] = '\0';
        *len = (size_t)n;
        return b;
}

struct job {
        kcache *kc;
        cl_context ctx;
        cl_device_id dev;
        const char *src;
        size_t len;
        const char *options;
        cl_program prog;
        cl_int err;
};

static void *build_thread(void *arg)
{
        struct job *j = arg;
        j->prog = kcache_cl_build_program(j->kc, j->ctx, 1, &j->dev, j->src, j->len, j->options, &j->err);
        return NULL;
}

static int cmp_name(const void *a, const void *b)
{
        return strcmp(*(char *const *)a, *(char *const *)b);
}

static void json_str(const char *s)
{
        putchar('"');
        for (; s && *s; s++) {
                if (*s == '"' || *s == '\\')
                        printf("\\%c", *s);
                else if (*s == '\n')
                        printf("\\n");
                else if ((unsigned char)*s >= 32)
                        putchar(*s);
        }
        putchar('"');
}

int main(int argc, char **argv)
{
        t_start = 0;
        t_start = now_ms();
        const char *dir = NULL, *source = NULL, *options = "";
        int nthreads = 1, nocache = 0, brk = 0;
        for (int i = 1; i < argc; i++) {
                if (!strcmp(argv[i], "--dir") && i + 1 < argc)
                        dir = argv[++i];
                else if (!strcmp(argv[i], "--no-cache"))
                        nocache = 1;
                else if (!strcmp(argv[i], "--source") && i + 1 < argc)
                        source = argv[++i];
                else if (!strcmp(argv[i], "--options") && i + 1 < argc)
                        options = argv[++i];
                else if (!strcmp(argv[i], "--threads") && i + 1 < argc)
                        nthreads = atoi(argv[++i]);
                else if (!strcmp(argv[i], "--break"))
                        brk = 1;
                else {
                        fprintf(stderr, "usage: kc-cl-demo [--dir DIR | --no-cache] [--source FILE] "
                                        "[--options OPTS] [--threads N] [--break]\n");
                        return 2;
                }
        }
        if (nthreads < 1 || nthreads > 64)
                nthreads = 1;
        size_t len;
        char *src = slurp(source ? source : KC_DEMO_SOURCE, &len);
        if (!src) {
                fprintf(stderr, "kc-cl-demo: cannot read %s\n", source ? source : KC_DEMO_SOURCE);
                return 2;
        }
        if (brk) {
                strcat(src, "\n__kernel void broken(__global float *o) { o[0] = undeclared_x; }\n");
                len = strlen(src);
        }
        kcache *kc = NULL;
        if (!nocache) {
                int r = kcache_open(dir, &kc);
                if (r < 0) {
                        fprintf(stderr, "kc-cl-demo: kcache_open: %s\n", kcache_strerror(r));
                        return 2;
                }
        }
        cl_platform_id plat;
        cl_device_id dev;
        cl_int e;
        if (clGetPlatformIDs(1, &plat, NULL) != CL_SUCCESS ||
            clGetDeviceIDs(plat, CL_DEVICE_TYPE_ALL, 1, &dev, NULL) != CL_SUCCESS) {
                fprintf(stderr, "kc-cl-demo: no OpenCL device\n");
                return 2;
        }
        cl_context ctx = clCreateContext(NULL, 1, &dev, NULL, NULL, &e);
        double t_init = now_ms();

        struct job jobs[64];
        pthread_t th[64];
        for (int i = 0; i < nthreads; i++) {
                jobs[i] = (struct job){ kc, ctx, dev, src, len, options, NULL, 0 };
                if (nthreads > 1)
                        pthread_create(&th[i], NULL, build_thread, &jobs[i]);
                else
                        build_thread(&jobs[i]);
        }
        int same = 1;
        for (int i = 0; i < nthreads; i++) {
                if (nthreads > 1)
                        pthread_join(th[i], NULL);
                same &= jobs[i].prog == jobs[0].prog && jobs[i].err == jobs[0].err;
        }
        double t_build = now_ms();
        cl_program prog = jobs[0].prog;
        char *log = NULL;
        unsigned long long sum = 1469598103934665603ull; /* FNV-1a over every result byte */
        int nkernels = 0;
        double t_first = 0;
        if (jobs[0].err != CL_SUCCESS) {
                size_t n = 0;
                if (prog && clGetProgramBuildInfo(prog, dev, CL_PROGRAM_BUILD_LOG, 0, NULL, &n) == CL_SUCCESS &&
                    (log = calloc(1, n + 1)))
                        clGetProgramBuildInfo(prog, dev, CL_PROGRAM_BUILD_LOG, n, log, NULL);
        } else {
                cl_command_queue q = clCreateCommandQueueWithProperties(ctx, dev, NULL, &e);
                float *host = malloc(N * sizeof(float));
                for (int i = 0; i < N; i++)
                        host[i] = (float)((i * 7919) % 1000) - 500.0f + (float)i * 0.25f;
                cl_mem in = clCreateBuffer(ctx, CL_MEM_READ_ONLY | CL_MEM_COPY_HOST_PTR, N * sizeof(float), host, &e);
                cl_mem out = clCreateBuffer(ctx, CL_MEM_READ_WRITE, N * sizeof(float), NULL, &e);
                cl_uint nk = 0;
                clCreateKernelsInProgram(prog, 0, NULL, &nk);
                cl_kernel *ks = calloc(nk, sizeof(*ks));
                clCreateKernelsInProgram(prog, nk, ks, NULL);
                char **names = calloc(nk, sizeof(*names));
                for (cl_uint i = 0; i < nk; i++) {
                        names[i] = calloc(1, 128);
                        clGetKernelInfo(ks[i], CL_KERNEL_FUNCTION_NAME, 127, names[i], NULL);
                        clReleaseKernel(ks[i]);
                }
                qsort(names, nk, sizeof(*names), cmp_name);
                for (cl_uint i = 0; i < nk; i++) {
                        cl_kernel k = clCreateKernel(prog, names[i], &e);
                        int n = N;
                        clSetKernelArg(k, 0, sizeof(out), &out);
                        clSetKernelArg(k, 1, sizeof(in), &in);
                        clSetKernelArg(k, 2, sizeof(int), &n);
                        size_t gs = N, ls = 64;
                        e = clEnqueueNDRangeKernel(q, k, 1, NULL, &gs, &ls, 0, NULL, NULL);
                        clEnqueueReadBuffer(q, out, CL_TRUE, 0, N * sizeof(float), host + 0, 0, NULL, NULL);
                        if (!t_first)
                                t_first = now_ms();
                        const unsigned char *b = (const unsigned char *)host;
                        for (size_t j = 0; j < N * sizeof(float); j++)
                                sum = (sum ^ b[j]) * 1099511628211ull;
                        for (int j = 0; j < N; j++) /* feed the next kernel something else */
                                host[j] = (float)((j * 7919) % 1000) - 500.0f + (float)i;
                        clEnqueueWriteBuffer(q, in, CL_TRUE, 0, N * sizeof(float), host, 0, NULL, NULL);
                        clReleaseKernel(k);
                        free(names[i]);
                        nkernels++;
                }
                free(names);
                free(ks);
                free(host);
                clReleaseMemObject(in);
                clReleaseMemObject(out);
                clReleaseCommandQueue(q);
        }
        double t_run = now_ms();
        /* What an application may ask of its program: the layer must answer as the driver would. */
        size_t nk_info = 0, names_len = 0, src_len = 0;
        cl_build_status bstatus = CL_BUILD_NONE;
        int kprog_ok = -1;
        char names_info[1024] = "";
        if (prog) {
                clGetProgramBuildInfo(prog, dev, CL_PROGRAM_BUILD_STATUS, sizeof(bstatus), &bstatus, NULL);
                clGetProgramInfo(prog, CL_PROGRAM_SOURCE, 0, NULL, &src_len);
                if (jobs[0].err == CL_SUCCESS) {
                        clGetProgramInfo(prog, CL_PROGRAM_NUM_KERNELS, sizeof(nk_info), &nk_info, NULL);
                        clGetProgramInfo(prog, CL_PROGRAM_KERNEL_NAMES, sizeof(names_info), names_info, &names_len);
                        cl_kernel k = clCreateKernel(prog, "mandel", &e);
                        cl_program kp = NULL;
                        if (k && clGetKernelInfo(k, CL_KERNEL_PROGRAM, sizeof(kp), &kp, NULL) == CL_SUCCESS)
                                kprog_ok = kp == prog;
                        if (k)
                                clReleaseKernel(k);
                }
        }
        for (int i = 0; i < nthreads; i++)
                if (jobs[i].prog)
                        clReleaseProgram(jobs[i].prog);
        struct kcache_stats st = { 0 };
        if (kc)
                kcache_get_stats(kc, &st);
        kcache_close(kc); /* stores binaries that grew while the kernels ran */
        clReleaseContext(ctx);
        double t_end = now_ms();
        printf("{\"init_ms\": %.1f, \"build_ms\": %.1f, \"first_result_ms\": %.1f, \"run_ms\": %.1f, "
               "\"total_ms\": %.1f, \"kernels\": %d, \"checksum\": \"%016llx\", \"err\": %d, \"same\": %s, "
               "\"hits\": %llu, \"misses\": %llu, \"memory_hits\": %llu, \"rejects\": %llu, \"compiles\": %llu, "
               "\"stores\": %llu, \"lock_waits\": %llu, \"num_kernels\": %zu, \"kernel_names\": \"%s\", "
               "\"source_len\": %zu, \"build_status\": %d, \"kernel_program_ok\": %d, \"log\": ",
               t_init, t_build - t_init, t_first, t_run, t_end, nkernels, sum, jobs[0].err, same ? "true" : "false",
               (unsigned long long)st.hits, (unsigned long long)st.misses, (unsigned long long)st.memory_hits,
               (unsigned long long)st.rejects, (unsigned long long)st.compiles, (unsigned long long)st.stores,
               (unsigned long long)st.lock_waits, nk_info, names_info, src_len, (int)bstatus, kprog_ok);
        json_str(log);
        printf("}\n");
        free(log);
        free(src);
        return jobs[0].err == CL_SUCCESS ? 0 : 1;
}
