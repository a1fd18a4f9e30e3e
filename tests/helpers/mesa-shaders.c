/* mesa-shaders: compiles and draws with N distinct GLES2 programs on Mesa (llvmpipe through EGL
 * surfaceless, no display), so that Mesa's shader cache (MESA_SHADER_CACHE_DIR) stores and finds them.
 *   mesa-shaders FIRST COUNT
 * Program i's fragment shader paints the pixel red = i % 251; each one is drawn once and the pixel read
 * back, so a wrong program (a cache entry that is not what it claims) fails. Prints one line:
 *   programs=N seconds=S wrong=W
 * and exits 1 if any program failed to compile, link or paint. */
#include <EGL/egl.h>
#include <EGL/eglext.h>
#include <GLES2/gl2.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static GLuint shader(GLenum type, const char *src)
{
        GLuint s = glCreateShader(type);
        glShaderSource(s, 1, &src, NULL);
        glCompileShader(s);
        GLint ok = 0;
        glGetShaderiv(s, GL_COMPILE_STATUS, &ok);
        if (!ok) {
                char log[1024] = "";
                glGetShaderInfoLog(s, sizeof(log), NULL, log);
                fprintf(stderr, "mesa-shaders: compile failed: %s\n", log);
                return 0;
        }
        return s;
}

int main(int argc, char **argv)
{
        if (argc != 3) {
                fprintf(stderr, "usage: mesa-shaders FIRST COUNT\n");
                return 2;
        }
        int first = atoi(argv[1]), count = atoi(argv[2]);
        PFNEGLGETPLATFORMDISPLAYEXTPROC get_display =
                (PFNEGLGETPLATFORMDISPLAYEXTPROC)eglGetProcAddress("eglGetPlatformDisplayEXT");
        EGLDisplay dpy = get_display ? get_display(EGL_PLATFORM_SURFACELESS_MESA, EGL_DEFAULT_DISPLAY, NULL)
                                     : EGL_NO_DISPLAY;
        EGLint major, minor;
        if (dpy == EGL_NO_DISPLAY || !eglInitialize(dpy, &major, &minor)) {
                fprintf(stderr, "mesa-shaders: no surfaceless EGL display\n");
                return 77;
        }
        eglBindAPI(EGL_OPENGL_ES_API);
        const EGLint cattr[] = { EGL_CONTEXT_CLIENT_VERSION, 2, EGL_NONE };
        EGLContext ctx = eglCreateContext(dpy, EGL_NO_CONFIG_KHR, EGL_NO_CONTEXT, cattr);
        if (ctx == EGL_NO_CONTEXT || !eglMakeCurrent(dpy, EGL_NO_SURFACE, EGL_NO_SURFACE, ctx)) {
                fprintf(stderr, "mesa-shaders: no GLES2 context\n");
                return 77;
        }
        GLuint fb, rb;
        glGenFramebuffers(1, &fb);
        glBindFramebuffer(GL_FRAMEBUFFER, fb);
        glGenRenderbuffers(1, &rb);
        glBindRenderbuffer(GL_RENDERBUFFER, rb);
        glRenderbufferStorage(GL_RENDERBUFFER, GL_RGBA4, 4, 4);
        glFramebufferRenderbuffer(GL_FRAMEBUFFER, GL_COLOR_ATTACHMENT0, GL_RENDERBUFFER, rb);
        glViewport(0, 0, 4, 4);
        const char *vs = "attribute vec2 p; void main() { gl_Position = vec4(p, 0.0, 1.0); }";
        static const float tri[] = { -1, -1, 3, -1, -1, 3 };
        struct timespec t0, t1;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        int wrong = 0, failed = 0;
        for (int i = first; i < first + count; i++) {
                char fs[1024];
                /* distinct per program, and some work for the compiler */
                snprintf(fs, sizeof(fs),
                         "precision mediump float; uniform float u;\n"
                         "void main() { float a = %d.0; for (int k = 0; k < %d; k++) a = fract(a * 1.37 + u + %d.0);\n"
                         "  gl_FragColor = vec4(float(%d) / 255.0 + a * 0.0, 0.0, 0.0, 1.0); }\n",
                         i, 4 + i % 13, i, i % 251);
                GLuint v = shader(GL_VERTEX_SHADER, vs), f = shader(GL_FRAGMENT_SHADER, fs);
                GLuint p = glCreateProgram();
                glAttachShader(p, v);
                glAttachShader(p, f);
                glBindAttribLocation(p, 0, "p");
                glLinkProgram(p);
                GLint ok = 0;
                glGetProgramiv(p, GL_LINK_STATUS, &ok);
                if (!v || !f || !ok) {
                        failed++;
                        continue;
                }
                glUseProgram(p);
                glUniform1f(glGetUniformLocation(p, "u"), 0.25f);
                glVertexAttribPointer(0, 2, GL_FLOAT, GL_FALSE, 0, tri);
                glEnableVertexAttribArray(0);
                glDrawArrays(GL_TRIANGLES, 0, 3);
                unsigned char px[4] = { 0 };
                glReadPixels(1, 1, 1, 1, GL_RGBA, GL_UNSIGNED_BYTE, px);
                /* RGBA4 keeps 4 bits of red: compare at that precision */
                if (abs((int)px[0] - (i % 251)) > 17)
                        wrong++;
                glDeleteProgram(p);
                glDeleteShader(v);
                glDeleteShader(f);
        }
        glFinish();
        clock_gettime(CLOCK_MONOTONIC, &t1);
        printf("programs=%d seconds=%.3f wrong=%d failed=%d\n", count,
               (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) / 1e9, wrong, failed);
        eglMakeCurrent(dpy, EGL_NO_SURFACE, EGL_NO_SURFACE, EGL_NO_CONTEXT);
        eglDestroyContext(dpy, ctx);
        eglTerminate(dpy); /* Mesa's cache queue is flushed here */
        return wrong || failed ? 1 : 0;
}
