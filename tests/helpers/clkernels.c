/* clkernels: builds and runs distinct OpenCL programs, one kernel each, and checks every result.
 *
 *   clkernels FIRST COUNT [ROUNDS]
 *
 * Program i computes a[g] = f_i(g) with a formula unique to i, so each one is a separate entry in the
 * runtime's cache. Prints one line per build ("build i ms") and a summary; exits non-zero if any build
 * or result is wrong. Used by tests/integration/test_runtimes_pocl.py with POCL_CACHE_DIR in a mount. */
#define CL_TARGET_OPENCL_VERSION 120
#include <CL/cl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define N 256

static double now_ms(void)
{
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

static float expect(int i, int g)
{
        float x = (float)g;
        float acc = x * (float)(i % 7 + 1) + (float)i;
        for (int k = 0; k < i % 5 + 2; k++)
                acc = acc * 0.5f + (float)(k + i);
        return acc;
}

int main(int argc, char **argv)
{
        if (argc < 3) {
                fprintf(stderr, "usage: clkernels FIRST COUNT [ROUNDS]\n");
                return 2;
        }
        int first = atoi(argv[1]), count = atoi(argv[2]), rounds = argc > 3 ? atoi(argv[3]) : 1;
        cl_platform_id plat;
        cl_device_id dev;
        cl_int err;
        if (clGetPlatformIDs(1, &plat, NULL) != CL_SUCCESS ||
            clGetDeviceIDs(plat, CL_DEVICE_TYPE_ALL, 1, &dev, NULL) != CL_SUCCESS) {
                fprintf(stderr, "clkernels: no OpenCL device\n");
                return 1;
        }
        cl_context ctx = clCreateContext(NULL, 1, &dev, NULL, NULL, &err);
        cl_command_queue q = clCreateCommandQueue(ctx, dev, 0, &err);
        cl_mem buf = clCreateBuffer(ctx, CL_MEM_READ_WRITE, N * sizeof(float), NULL, &err);
        int failures = 0;
        double total = 0;
        for (int r = 0; r < rounds; r++) {
                for (int j = 0; j < count; j++) {
                        int i = first + j;
                        char src[1024];
                        snprintf(src, sizeof(src),
                                 "__kernel void k%d(__global float *a) {\n"
                                 "  size_t g = get_global_id(0);\n"
                                 "  float acc = (float)g * %d.0f + %d.0f;\n"
                                 "  for (int k = 0; k < %d; k++) acc = acc * 0.5f + (float)(k + %d);\n"
                                 "  a[g] = acc;\n"
                                 "}\n",
                                 i, i % 7 + 1, i, i % 5 + 2, i);
                        const char *s = src;
                        double t0 = now_ms();
                        cl_program p = clCreateProgramWithSource(ctx, 1, &s, NULL, &err);
                        err = clBuildProgram(p, 1, &dev, "", NULL, NULL);
                        if (err != CL_SUCCESS) {
                                char log[4096] = "";
                                clGetProgramBuildInfo(p, dev, CL_PROGRAM_BUILD_LOG, sizeof(log), log, NULL);
                                fprintf(stderr, "clkernels: build of %d failed: %d\n%s\n", i, err, log);
                                failures++;
                                clReleaseProgram(p);
                                continue;
                        }
                        char name[32];
                        snprintf(name, sizeof(name), "k%d", i);
                        cl_kernel k = clCreateKernel(p, name, &err);
                        clSetKernelArg(k, 0, sizeof(buf), &buf);
                        size_t gsz = N;
                        err = clEnqueueNDRangeKernel(q, k, 1, NULL, &gsz, NULL, 0, NULL, NULL);
                        float out[N];
                        if (err == CL_SUCCESS)
                                err = clEnqueueReadBuffer(q, buf, CL_TRUE, 0, sizeof(out), out, 0, NULL, NULL);
                        double dt = now_ms() - t0;
                        total += dt;
                        int bad = err != CL_SUCCESS;
                        for (int g = 0; !bad && g < N; g++)
                                bad = fabsf(out[g] - expect(i, g)) > 1e-3f * fmaxf(1.0f, fabsf(expect(i, g)));
                        if (bad) {
                                fprintf(stderr, "clkernels: kernel %d: wrong result (err %d)\n", i, err);
                                failures++;
                        }
                        printf("build %d %.1f\n", i, dt);
                        clReleaseKernel(k);
                        clReleaseProgram(p);
                }
        }
        printf("total %.1f ms, %d failures\n", total, failures);
        clReleaseMemObject(buf);
        clReleaseCommandQueue(q);
        clReleaseContext(ctx);
        return failures ? 1 : 0;
}
