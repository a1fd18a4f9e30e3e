/* A kernel suite shaped like an application's: twelve kernels of the usual kinds, every one with the
 * signature (out, in, n), so a host program can launch them all the same way with local size 64.
 * Used by tests/helpers/kc-cl-demo.c and bench/ to measure cold and warm starts. */

#define LS 64

float poly(float x);
float poly(float x)
{
        float r = 0.0f;
        for (int k = 7; k >= 0; k--)
                r = r * x + (float)(k + 1) * 0.125f;
        return r;
}

/* 1: y = a*x + y with a polynomial twist */
__kernel void saxpy_poly(__global float *out, __global const float *in, int n)
{
        int g = get_global_id(0);
        if (g >= n)
                return;
        float x = in[g];
        out[g] = 2.5f * x + poly(x * 0.001f);
}

/* 2: work-group tree reduction */
__kernel void reduce_sum(__global float *out, __global const float *in, int n)
{
        __local float s[LS];
        int g = get_global_id(0), l = get_local_id(0);
        s[l] = g < n ? in[g] : 0.0f;
        barrier(CLK_LOCAL_MEM_FENCE);
        for (int w = LS / 2; w > 0; w >>= 1) {
                if (l < w)
                        s[l] += s[l + w];
                barrier(CLK_LOCAL_MEM_FENCE);
        }
        if (g < n) /* the group's sum in its first slot, the inputs in the others: one writer each */
                out[g] = l == 0 ? s[0] : in[g];
}

/* 3: inclusive scan inside each work-group (Hillis-Steele) */
__kernel void scan_group(__global float *out, __global const float *in, int n)
{
        __local float a[LS], b[LS];
        int g = get_global_id(0), l = get_local_id(0);
        a[l] = g < n ? in[g] * 0.01f : 0.0f;
        barrier(CLK_LOCAL_MEM_FENCE);
        __local float *src = a, *dst = b;
        for (int off = 1; off < LS; off <<= 1) {
                dst[l] = src[l] + (l >= off ? src[l - off] : 0.0f);
                barrier(CLK_LOCAL_MEM_FENCE);
                __local float *t = src;
                src = dst;
                dst = t;
        }
        if (g < n)
                out[g] = src[l];
}

/* 4: 3-point then 5-point stencil with clamped borders */
__kernel void stencil5(__global float *out, __global const float *in, int n)
{
        int g = get_global_id(0);
        if (g >= n)
                return;
        float c[5];
        for (int k = -2; k <= 2; k++) {
                int i = clamp(g + k, 0, n - 1);
                c[k + 2] = in[i];
        }
        float s3 = 0.25f * c[1] + 0.5f * c[2] + 0.25f * c[3];
        float s5 = (c[0] + 4.0f * c[1] + 6.0f * c[2] + 4.0f * c[3] + c[4]) / 16.0f;
        out[g] = 0.5f * (s3 + s5);
}

/* 5: 64-bin histogram per work-group, written back as counts into the group's slots */
__kernel void histogram64(__global float *out, __global const float *in, int n)
{
        __local int bins[LS];
        int g = get_global_id(0), l = get_local_id(0);
        bins[l] = 0;
        barrier(CLK_LOCAL_MEM_FENCE);
        if (g < n) {
                int b = ((int)fabs(in[g])) & (LS - 1);
                atomic_inc(&bins[b]);
        }
        barrier(CLK_LOCAL_MEM_FENCE);
        if (g < n)
                out[g] = (float)bins[l];
}

/* 6: tiled transpose of the input seen as an 8 x (n/8) matrix */
__kernel void transpose8(__global float *out, __global const float *in, int n)
{
        __local float tile[LS];
        int g = get_global_id(0), l = get_local_id(0);
        tile[l] = g < n ? in[g] : 0.0f;
        barrier(CLK_LOCAL_MEM_FENCE);
        int r = l / 8, c = l % 8;
        float v = tile[c * 8 + r];
        if (g < n)
                out[g] = v;
}

/* 7: one n-body step in 1-D against the work-group's particles */
__kernel void nbody1d(__global float *out, __global const float *in, int n)
{
        __local float p[LS];
        int g = get_global_id(0), l = get_local_id(0);
        float x = g < n ? in[g] * 0.001f : 0.0f;
        p[l] = x;
        barrier(CLK_LOCAL_MEM_FENCE);
        float f = 0.0f;
        for (int j = 0; j < LS; j++) {
                float d = p[j] - x;
                f += d / (d * d + 0.01f) * 0.001f;
        }
        if (g < n)
                out[g] = x + f;
}

/* 8: Mandelbrot escape count for a point derived from the index */
__kernel void mandel(__global float *out, __global const float *in, int n)
{
        int g = get_global_id(0);
        if (g >= n)
                return;
        float cr = -2.0f + 2.5f * (float)(g % 64) / 64.0f;
        float ci = -1.25f + 2.5f * (float)((g / 64) % 64) / 64.0f + in[g] * 1e-6f;
        float zr = 0.0f, zi = 0.0f;
        int it = 0;
        while (it < 64 && zr * zr + zi * zi < 4.0f) {
                float t = zr * zr - zi * zi + cr;
                zi = 2.0f * zr * zi + ci;
                zr = t;
                it++;
        }
        out[g] = (float)it;
}

/* 9: Sobel magnitude on the input seen as rows of 64 */
__kernel void sobel(__global float *out, __global const float *in, int n)
{
        int g = get_global_id(0);
        if (g >= n)
                return;
        int w = 64, x = g % w, y = g / w, h = n / w;
        float v[3][3];
        for (int dy = -1; dy <= 1; dy++)
                for (int dx = -1; dx <= 1; dx++) {
                        int xx = clamp(x + dx, 0, w - 1), yy = clamp(y + dy, 0, h - 1);
                        v[dy + 1][dx + 1] = in[yy * w + xx];
                }
        float gx = v[0][2] + 2.0f * v[1][2] + v[2][2] - v[0][0] - 2.0f * v[1][0] - v[2][0];
        float gy = v[2][0] + 2.0f * v[2][1] + v[2][2] - v[0][0] - 2.0f * v[0][1] - v[0][2];
        out[g] = sqrt(gx * gx + gy * gy);
}

/* 10: bitonic sort of each work-group's 64 values */
__kernel void bitonic64(__global float *out, __global const float *in, int n)
{
        __local float s[LS];
        int g = get_global_id(0), l = get_local_id(0);
        s[l] = g < n ? in[g] : INFINITY;
        barrier(CLK_LOCAL_MEM_FENCE);
        for (int k = 2; k <= LS; k <<= 1) {
                for (int j = k >> 1; j > 0; j >>= 1) {
                        int p = l ^ j;
                        if (p > l) {
                                bool up = (l & k) == 0;
                                float a = s[l], b = s[p];
                                if ((a > b) == up) {
                                        s[l] = b;
                                        s[p] = a;
                                }
                        }
                        barrier(CLK_LOCAL_MEM_FENCE);
                }
        }
        if (g < n)
                out[g] = s[l];
}

/* 11: Black-Scholes call price with the input as the strike */
float cnd(float d);
float cnd(float d)
{
        const float a1 = 0.31938153f, a2 = -0.356563782f, a3 = 1.781477937f, a4 = -1.821255978f,
                    a5 = 1.330274429f;
        float k = 1.0f / (1.0f + 0.2316419f * fabs(d));
        float c = 0.39894228f * exp(-0.5f * d * d) * k * (a1 + k * (a2 + k * (a3 + k * (a4 + k * a5))));
        return d > 0 ? 1.0f - c : c;
}

__kernel void black_scholes(__global float *out, __global const float *in, int n)
{
        int g = get_global_id(0);
        if (g >= n)
                return;
        float s = 100.0f, k = 50.0f + fmod(fabs(in[g]), 100.0f), t = 1.0f, r = 0.02f, v = 0.3f;
        float d1 = (log(s / k) + (r + 0.5f * v * v) * t) / (v * sqrt(t));
        float d2 = d1 - v * sqrt(t);
        out[g] = s * cnd(d1) - k * exp(-r * t) * cnd(d2);
}

/* 12: a small dense matrix-vector product: 8x8 blocks along the input */
__kernel void matvec8(__global float *out, __global const float *in, int n)
{
        __local float x[LS];
        int g = get_global_id(0), l = get_local_id(0);
        x[l] = g < n ? in[g] * 0.01f : 0.0f;
        barrier(CLK_LOCAL_MEM_FENCE);
        int row = l % 8, blk = l / 8;
        float acc = 0.0f;
        for (int c = 0; c < 8; c++) {
                float m = (float)((row * 8 + c) % 5) - 2.0f;
                acc += m * x[blk * 8 + c];
        }
        if (g < n)
                out[g] = acc + (float)row;
}

/* 13: fused softmax over each work-group (max, exp-sum, normalise) */
__kernel void softmax64(__global float *out, __global const float *in, int n)
{
        __local float s[LS];
        __local float red[LS];
        int g = get_global_id(0), l = get_local_id(0);
        float v = g < n ? in[g] * 0.001f : -INFINITY;
        s[l] = v;
        red[l] = v;
        barrier(CLK_LOCAL_MEM_FENCE);
        for (int w = LS / 2; w > 0; w >>= 1) {
                if (l < w)
                        red[l] = fmax(red[l], red[l + w]);
                barrier(CLK_LOCAL_MEM_FENCE);
        }
        float mx = red[0];
        barrier(CLK_LOCAL_MEM_FENCE);
        red[l] = g < n ? exp(s[l] - mx) : 0.0f;
        barrier(CLK_LOCAL_MEM_FENCE);
        for (int w = LS / 2; w > 0; w >>= 1) {
                if (l < w)
                        red[l] += red[l + w];
                barrier(CLK_LOCAL_MEM_FENCE);
        }
        if (g < n)
                out[g] = exp(s[l] - mx) / red[0];
}

/* 14: a 4-stage xorshift hash per element (integer work) */
__kernel void hash_mix(__global float *out, __global const float *in, int n)
{
        int g = get_global_id(0);
        if (g >= n)
                return;
        uint x = as_uint(in[g]) ^ (uint)g * 2654435761u;
        for (int r = 0; r < 4; r++) {
                x ^= x << 13;
                x ^= x >> 17;
                x ^= x << 5;
                x = x * 0x9E3779B1u + (uint)r;
        }
        out[g] = (float)(x & 0xffff);
}
