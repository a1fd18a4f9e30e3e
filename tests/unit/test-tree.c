/* test-tree.c: common/tree.c, the door to the backing tree (tree.h, R1-R4), on a real directory: both
 * resolvers (openat2, and the per-component walk of kernels without it) refuse every way out that a user
 * of a shared mount can build inside the tree: a symlink anywhere in a path, "..", an absolute path, a
 * mount point; a walk by identities refuses a component that holds another directory; a removal
 * refuses a name that holds another object; so does ktree_open_cached, the dentry cache's resolution. A
 * mount point is tried only as root. ktree_chase_dir, the walk of an operator's path: follows the
 * caller's links, refuses another user's link and any step below a directory others may write or another
 * user owns (as root), takes such a directory as the last step. */
#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "../../common/tree.h"
#include "tutil.h"

static char *at(const char *dir, const char *rel)
{
        static char buf[4][4096];
        static int n;
        char *b = buf[n++ % 4];
        if (snprintf(b, sizeof(buf[0]), "%s/%s", dir, rel) >= (int)sizeof(buf[0]))
                abort();
        return b;
}

static void run(const char *root, const char *outside, bool walk)
{
        ktree__force_walk(walk);
        struct ktree t;
        CHECK_EQ(ktree_init(&t, root), 0);
        /* the ordinary: files and directories beneath, symlinks as objects with O_PATH */
        int fd = ktree_open(&t, KTREE_ROOT, "a/b/file", O_RDONLY, 0);
        CHECK(fd >= 0);
        if (fd >= 0)
                close(fd);
        fd = ktree_open(&t, KTREE_ROOT, "a/link", O_PATH, 0);
        struct stat st;
        CHECK(fd >= 0 && fstat(fd, &st) == 0 && S_ISLNK(st.st_mode));
        if (fd >= 0)
                close(fd);
        CHECK(ktree_stat(&t, KTREE_ROOT, "", &st) == 0 && S_ISDIR(st.st_mode));
        /* the ways out */
        CHECK_EQ(ktree_open(&t, KTREE_ROOT, "a/link/secret", O_RDONLY, 0), -ELOOP); /* a symlink component */
        int r = ktree_open(&t, KTREE_ROOT, "a/link", O_RDONLY | O_DIRECTORY, 0); /* a directory that is a link */
        CHECK(r == -ELOOP || r == -ENOTDIR);
        CHECK_EQ(ktree_open(&t, KTREE_ROOT, "a/flink", O_WRONLY | O_TRUNC, 0), -ELOOP); /* the last one */
        CHECK_EQ(ktree_open(&t, KTREE_ROOT, "a/../../x", O_RDONLY, 0), -EXDEV);
        CHECK_EQ(ktree_open(&t, KTREE_ROOT, "a/../a/b/file", O_RDONLY, 0), -EXDEV); /* climbs, if back */
        CHECK_EQ(ktree_open(&t, KTREE_ROOT, "a/b/..", O_PATH, 0), -EXDEV);
        fd = ktree_open(&t, KTREE_ROOT, "a/b/..file", O_RDONLY, 0); /* a name that starts with ".." */
        CHECK(fd == -ENOENT);
        CHECK_EQ(ktree_open(&t, KTREE_ROOT, outside, O_RDONLY, 0), -EXDEV);
        CHECK(ktree_opendir(&t, KTREE_ROOT, "a/link") == NULL && (errno == ELOOP || errno == ENOTDIR));
        int dfd = ktree_open(&t, KTREE_ROOT, "a", O_PATH | O_DIRECTORY, 0);
        CHECK(dfd >= 0);
        CHECK_EQ(ktree_open(&t, dfd, "link/secret", O_RDONLY, 0), -ELOOP); /* beneath a held directory */
        CHECK_EQ(ktree_open(&t, dfd, "..", O_PATH, 0), -EXDEV);
        /* from the dentry cache only (fs/refresh.c's child, in the daemon's own mount): the same refusals,
         * and a name the kernel would have to look up fails instead */
        fd = ktree_open_cached(&t, KTREE_ROOT, "a/b/file");
        if (fd == -ENOSYS) { /* no openat2 here (valgrind knows none; Linux < 5.6): it says so, and no more */
                CHECK_EQ(ktree_open_cached(&t, KTREE_ROOT, "a/link/secret"), -ENOSYS);
        } else {
                CHECK(fd >= 0);
                if (fd >= 0)
                        close(fd);
                CHECK_EQ(ktree_open_cached(&t, KTREE_ROOT, "a/link/secret"), -ELOOP);
                CHECK_EQ(ktree_open_cached(&t, KTREE_ROOT, "a/../a/b/file"), -EXDEV);
                CHECK_EQ(ktree_open_cached(&t, KTREE_ROOT, outside), -EXDEV);
                CHECK_EQ(ktree_open_cached(&t, dfd, "link/secret"), -ELOOP);
                fd = ktree_open_cached(&t, KTREE_ROOT, "a/flink"); /* the link itself, never its target */
                CHECK(fd >= 0 && fstat(fd, &st) == 0 && S_ISLNK(st.st_mode));
                if (fd >= 0)
                        close(fd);
                r = ktree_open_cached(&t, KTREE_ROOT, "a/b/never-looked-up");
                CHECK(r == -EAGAIN || r == -ENOENT);
        }
        /* creation never through a symlink either */
        CHECK_EQ(ktree_open(&t, dfd, "flink", O_WRONLY | O_CREAT, 0600), -ELOOP);
        fd = ktree_open(&t, dfd, "new", O_WRONLY | O_CREAT | O_EXCL, 0600);
        CHECK(fd >= 0 && fstat(fd, &st) == 0 && (st.st_mode & 07777) == 0600);
        int f2 = ktree_open(&t, dfd, "typed", O_WRONLY | O_CREAT | O_TRUNC, S_IFREG | 0640); /* as FUSE's create */
        CHECK(f2 >= 0);
        if (f2 >= 0)
                close(f2);
        CHECK_EQ(ktree_unlink(&t, dfd, "typed", NULL, 0), 0);
        /* removal checks identity (R4) */
        struct stat other;
        CHECK(stat(at(root, "a/b/file"), &other) == 0);
        CHECK_EQ(ktree_unlink(&t, dfd, "new", &other, 0), -ESTALE);
        CHECK(access(at(root, "a/new"), F_OK) == 0);
        CHECK_EQ(ktree_unlink(&t, dfd, "new", &st, 0), 0);
        CHECK_EQ(ktree_unlink(&t, dfd, "b/file", NULL, 0), -EINVAL);
        CHECK_EQ(ktree_unlink(&t, dfd, "..", NULL, AT_REMOVEDIR), -EINVAL);
        CHECK_EQ(ktree_unlink_ino(&t, dfd, "flink", other.st_ino, 0), -ESTALE); /* another object */
        CHECK(access(at(root, "a/flink"), F_OK) == 0 || errno == ENOENT);
        if (fd >= 0)
                close(fd);
        /* a walk by identities */
        struct stat sa, sb;
        CHECK(stat(at(root, "a"), &sa) == 0 && stat(at(root, "a/b"), &sb) == 0);
        const char *names[] = { "a", "b" };
        uint64_t inos[] = { sa.st_ino, sb.st_ino };
        fd = ktree_walk(&t, 2, names, inos, O_PATH);
        CHECK(fd >= 0 && fstat(fd, &st) == 0 && st.st_ino == sb.st_ino);
        if (fd >= 0)
                close(fd);
        uint64_t wrong[] = { sa.st_ino, sa.st_ino };
        CHECK_EQ(ktree_walk(&t, 2, names, wrong, O_PATH), -ESTALE);
        const char *via_link[] = { "a", "link" };
        CHECK_EQ(ktree_walk(&t, 2, via_link, inos, O_PATH), -ESTALE);
        const char *bad[] = { "a", "../a" };
        CHECK_EQ(ktree_walk(&t, 2, bad, inos, O_PATH), -EINVAL);
        /* renames and makes take one name */
        CHECK_EQ(ktree_rename(&t, dfd, "b", dfd, "../b", 0), -EINVAL);
        CHECK_EQ(ktree_mkdir(&t, dfd, "x/y", 0700), -EINVAL);
        CHECK_EQ(ktree_mkdir(&t, dfd, "d", 0700), 0);
        CHECK_EQ(ktree_unlink(&t, dfd, "d", NULL, AT_REMOVEDIR), 0);
        /* a mount point is another filesystem (R3) */
        if (geteuid() == 0 && mkdir(at(root, "mnt"), 0700) == 0 &&
            mount("tmpfs", at(root, "mnt"), "tmpfs", 0, "size=1m") == 0) {
                CHECK_EQ(ktree_open(&t, KTREE_ROOT, "mnt", O_PATH, 0), -EXDEV);
                CHECK_EQ(ktree_open(&t, KTREE_ROOT, "mnt/.", O_RDONLY, 0), -EXDEV);
                umount(at(root, "mnt"));
                rmdir(at(root, "mnt"));
        }
        close(dfd);
        ktree_close(&t);
}

/* R3 under renames: openat2 answers a ".." that would leave with EAGAIN, not EXDEV, when any rename on the
 * system raced with it (794 of 200,000 here with a renamer running); ktree_open refuses ".." itself. */
static void climb_while_renaming(const char *root)
{
        int started[2];
        CHECK(pipe(started) == 0);
        pid_t renamer = fork();
        if (renamer == 0) {
                prctl(PR_SET_PDEATHSIG, SIGKILL); /* never outlives a test killed meanwhile */
                if (getppid() == 1)
                        _exit(0);
                char a[4096], b[4096];
                snprintf(a, sizeof(a), "%s/r1", root);
                snprintf(b, sizeof(b), "%s/r2", root);
                for (bool told = false;; told = true) {
                        close(open(a, O_CREAT | O_WRONLY | O_CLOEXEC, 0600));
                        rename(a, b);
                        if (!told)
                                (void)!write(started[1], "x", 1);
                }
        }
        CHECK(renamer > 0);
        close(started[1]);
        char x;
        CHECK(renamer < 0 || read(started[0], &x, 1) == 1); /* renaming already */
        close(started[0]);
        ktree__force_walk(false); /* openat2 */
        struct ktree t;
        CHECK_EQ(ktree_init(&t, root), 0);
        int wrong = 0, last = 0;
        for (int i = 0; i < 200000; i++) {
                int r = ktree_open(&t, KTREE_ROOT, "a/../../x", O_RDONLY, 0);
                if (r != -EXDEV) {
                        wrong++;
                        last = r;
                }
                if (r >= 0)
                        close(r);
        }
        if (renamer > 0) {
                kill(renamer, SIGKILL);
                waitpid(renamer, NULL, 0);
        }
        if (wrong)
                fprintf(stderr, "%d of 200000 climbs answered %d, not -EXDEV\n", wrong, last);
        CHECK_EQ(wrong, 0);
        ktree_close(&t);
}

static bool same_dir(int fd, const char *path)
{
        struct stat a, b;
        return fd >= 0 && fstat(fd, &a) == 0 && stat(path, &b) == 0 && a.st_ino == b.st_ino && a.st_dev == b.st_dev;
}

static void chase(const char *root, const char *out)
{
        char why[8192];
        uid_t me = geteuid();
        int fd = ktree_chase_dir(at(root, "a/b"), me, why, sizeof(why));
        CHECK(same_dir(fd, at(root, "a/b")));
        close(fd);
        fd = ktree_chase_dir(at(root, "a/link"), me, why, sizeof(why)); /* the caller's own link: followed */
        CHECK(same_dir(fd, out));
        close(fd);
        CHECK(mkdir(at(root, "w"), 0700) == 0 && chmod(at(root, "w"), 0777) == 0 &&
              mkdir(at(root, "w/x"), 0700) == 0);
        CHECK_EQ(ktree_chase_dir(at(root, "w/x"), me, why, sizeof(why)), -EACCES); /* below one open to all */
        CHECK(strstr(why, "writable by others") != NULL);
        fd = ktree_chase_dir(at(root, "w"), me, why, sizeof(why)); /* as the last step */
        CHECK(same_dir(fd, at(root, "w")));
        close(fd);
        CHECK(chmod(at(root, "w"), 01777) == 0); /* sticky: nobody renames what is not theirs */
        fd = ktree_chase_dir(at(root, "w/x"), me, why, sizeof(why));
        CHECK(same_dir(fd, at(root, "w/x")));
        close(fd);
        CHECK_EQ(ktree_chase_dir(at(root, "a/b/file"), me, why, sizeof(why)), -ENOTDIR);
        if (me == 0) { /* another user's directory and link */
                CHECK(mkdir(at(root, "h"), 0755) == 0 && mkdir(at(root, "h/y"), 0755) == 0 &&
                      chown(at(root, "h"), 4242, 4242) == 0);
                CHECK_EQ(ktree_chase_dir(at(root, "h/y"), 0, why, sizeof(why)), -EACCES);
                CHECK(strstr(why, "belongs to uid 4242") != NULL);
                fd = ktree_chase_dir(at(root, "h"), 0, why, sizeof(why));
                CHECK(same_dir(fd, at(root, "h")));
                close(fd);
                CHECK(lchown(at(root, "a/link"), 4242, 4242) == 0);
                CHECK_EQ(ktree_chase_dir(at(root, "a/link"), 0, why, sizeof(why)), -EACCES);
                CHECK(strstr(why, "symbolic link of uid 4242") != NULL);
                CHECK(lchown(at(root, "a/link"), 0, 0) == 0);
        }
}

int main(void)
{
        char *root = tutil_tmpdir(), *out = tutil_tmpdir();
        char secret[4096];
        snprintf(secret, sizeof(secret), "%s/secret", out);
        FILE *f = fopen(secret, "w");
        CHECK(f != NULL);
        if (f)
                fclose(f);
        CHECK(mkdir(at(root, "a"), 0755) == 0 && mkdir(at(root, "a/b"), 0755) == 0);
        tutil_write_file(at(root, "a/b"), "file", 10);
        CHECK(symlink(out, at(root, "a/link")) == 0);
        CHECK(symlink(secret, at(root, "a/flink")) == 0);
        run(root, secret, false);
        run(root, secret, true);
        climb_while_renaming(root);
        chase(root, out);
        struct stat st;
        CHECK(stat(secret, &st) == 0 && st.st_size == 0); /* never reached */
        tutil_rmrf(root);
        tutil_rmrf(out);
        free(root);
        free(out);
        return tutil_done("test-tree");
}
