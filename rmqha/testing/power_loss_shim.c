/* power_loss_shim.c: an LD_PRELOAD library that records, at the libc call, what a power
 * loss would leave of one data directory (issue 40.2).
 *
 * Why: a SIGKILL keeps the page cache, so a crash test cannot tell whether anything was
 * fsynced, and an image copied inside the code's own sync hook still holds what the code
 * meant to sync rather than what it did sync.  This library sits under the process at the
 * C library: removing a sync call from the code removes the durability it records.
 *
 * Model (strict POSIX, close to Jepsen's LazyFS; docs/guarantees.md "Power loss"):
 *   - fsync(fd) / fdatasync(fd) of a regular file under the root: the whole file (its
 *     bytes and size, holes kept as holes) becomes the durable content of its inode.
 *   - msync(addr, len, MS_SYNC): the synced range of each file mapping it covers (found in
 *     /proc/self/maps) becomes durable in that inode, with the file's current size
 *     (Linux's msync is an fdatasync of the range: the size needed to read it is synced).
 *     MS_ASYNC makes nothing durable.
 *   - fsync(fd) of a directory under the root (or the root itself): the directory's
 *     current entries (name -> inode) become its durable listing.  A file created,
 *     renamed or removed is so after a power loss only once its directory was fsynced; a
 *     new directory likewise needs its parent's fsync, and its own for what it contains.
 *   - sync() and syncfs(): everything under the root, entries and content.
 *   - sync_file_range: nothing (it syncs neither metadata nor the disk's cache).
 *   - O_SYNC / O_DSYNC opens are not modelled (rmqha uses none; a unit test checks).
 * Every unsynced write is lost: the harshest of the outcomes a power loss may have (no
 * torn or reordered writes are made up).  Writes that race a sync may be recorded with it,
 * as a real disk may keep them too.
 *
 * State, under RMQHA_POWERLOSS_SHADOW (rmqha/testing/power_loss.py writes the baseline
 * and builds the image from it):
 *   ino/<inode>   the durable content of an inode
 *   dir/<inode>   the durable listing of a directory inode: lines "<f|d> <inode> <name>"
 *   root          the root directory's inode (written by the Python side)
 *   lock          flock-ed around every update: the test cuts the power while holding it,
 *                 so the image is always the state between two syncs, never half of one
 *   syncs.log     one line per sync recorded: "<call> <inode> <path relative to root>"
 *
 * Environment (read once at load; children inherit it, and an exec wrapper such as
 * pyenv's must keep it, so it stays: rmqha's servers start no children that write):
 *   RMQHA_POWERLOSS_ROOT    absolute, symlink-free path of the data directory
 *   RMQHA_POWERLOSS_SHADOW  the state directory above
 *   RMQHA_POWERLOSS_BOOT_ID what /proc/sys/kernel/random/boot_id reads as: the harness
 *                           gives each start after a power loss a new one, so the process
 *                           recovers as after a reboot (rmqha trusts the page cache of
 *                           its own boot more, rmqha.store.checkpoint.boot_id)
 *   RMQHA_POWERLOSS_SKIP    comma-separated fnmatch patterns on paths relative to the
 *                           root: a sync of a matching file or directory still reaches the
 *                           kernel but is not recorded, exactly as if that sync call had
 *                           been deleted from the code (the tests' negative controls).
 * Limits: one process per root; inode numbers are assumed not reused while it runs
 * (an unlinked inode's number given to a new file would share its recorded content);
 * hard links and symlinks are not modelled.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <fnmatch.h>
#include <ftw.h>
#include <limits.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

static int (*real_open)(const char *, int, ...);
static int (*real_openat)(int, const char *, int, ...);
static int (*real_fsync)(int);
static int (*real_fdatasync)(int);
static int (*real_msync)(void *, size_t, int);
static int (*real_syncfs)(int);
static void (*real_sync)(void);

static int active;
static char root[PATH_MAX];
static size_t root_len;
static char shadow[PATH_MAX];
static char skip[4096];
static char boot_id[64];  /* the boot id this process is told (a power loss is a reboot) */
static int lock_fd = -1;
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;

static void resolve(void) {
    if (real_fsync) return;
    real_fdatasync = (int (*)(int))dlsym(RTLD_NEXT, "fdatasync");
    real_msync = (int (*)(void *, size_t, int))dlsym(RTLD_NEXT, "msync");
    real_syncfs = (int (*)(int))dlsym(RTLD_NEXT, "syncfs");
    real_sync = (void (*)(void))dlsym(RTLD_NEXT, "sync");
    real_open = (int (*)(const char *, int, ...))dlsym(RTLD_NEXT, "open");
    real_openat = (int (*)(int, const char *, int, ...))dlsym(RTLD_NEXT, "openat");
    real_fsync = (int (*)(int))dlsym(RTLD_NEXT, "fsync");
}

__attribute__((constructor)) static void init(void) {
    resolve();
    const char *r = getenv("RMQHA_POWERLOSS_ROOT");
    const char *s = getenv("RMQHA_POWERLOSS_SHADOW");
    const char *k = getenv("RMQHA_POWERLOSS_SKIP");
    if (!r || !s || strlen(r) >= sizeof root || strlen(s) + 64 >= sizeof shadow) return;
    strcpy(root, r);
    root_len = strlen(root);
    while (root_len > 1 && root[root_len - 1] == '/') root[--root_len] = 0;
    strcpy(shadow, s);
    if (k && strlen(k) < sizeof skip) strcpy(skip, k);
    const char *b = getenv("RMQHA_POWERLOSS_BOOT_ID");
    if (b && strlen(b) + 2 < sizeof boot_id) snprintf(boot_id, sizeof boot_id, "%s\n", b);
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s/lock", shadow);
    lock_fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (lock_fd < 0) {
        fprintf(stderr, "power_loss_shim: cannot open %s: %s\n", path, strerror(errno));
        abort();  /* a test that believes it records power loss must not run without it */
    }
    active = 1;
}

static void fail(const char *what, const char *path) {
    /* The record would be wrong: stop loudly rather than let a test pass on it. */
    fprintf(stderr, "power_loss_shim: %s %s: %s\n", what, path, strerror(errno));
    abort();
}

/* The path relative to the root (into rel) if `path` is the root or under it. */
static int relative(const char *path, char *rel, size_t size) {
    if (strncmp(path, root, root_len) != 0) return 0;
    if (path[root_len] == 0) { snprintf(rel, size, "."); return 1; }
    if (path[root_len] != '/') return 0;
    snprintf(rel, size, "%s", path + root_len + 1);
    return 1;
}

static int skipped(const char *rel) {
    char patterns[sizeof skip];
    strcpy(patterns, skip);
    char *save = NULL;
    for (char *p = strtok_r(patterns, ",", &save); p; p = strtok_r(NULL, ",", &save))
        if (*p && fnmatch(p, rel, 0) == 0) return 1;
    return 0;
}

static void note(const char *call, ino_t ino, const char *rel) {
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s/syncs.log", shadow);
    FILE *f = fopen(path, "ae");
    if (!f) fail("open", path);
    fprintf(f, "%s %ju %s\n", call, (uintmax_t)ino, rel);
    fclose(f);
}

static void shadow_path(char *out, size_t size, const char *kind, ino_t ino, const char *suffix) {
    snprintf(out, size, "%s/%s/%ju%s", shadow, kind, (uintmax_t)ino, suffix);
}

/* Copy src (open for reading) into a new file at dst_tmp, holes kept, then rename to dst. */
static void copy_whole(int src, off_t size, const char *dst_tmp, const char *dst) {
    int out = open(dst_tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (out < 0) fail("open", dst_tmp);
    if (ftruncate(out, size) != 0) fail("truncate", dst_tmp);
    static char buf[1 << 20];
    off_t pos = 0;
    while (pos < size) {
        off_t data = lseek(src, pos, SEEK_DATA);
        if (data < 0) break;  /* ENXIO: only a hole is left */
        off_t hole = lseek(src, data, SEEK_HOLE);
        if (hole < 0) hole = size;
        for (off_t at = data; at < hole;) {
            size_t want = (size_t)(hole - at) < sizeof buf ? (size_t)(hole - at) : sizeof buf;
            ssize_t n = pread(src, buf, want, at);
            if (n < 0) fail("read for", dst);
            if (n == 0) break;
            if (pwrite(out, buf, (size_t)n, at) != n) fail("write", dst_tmp);
            at += n;
        }
        pos = hole;
    }
    close(out);
    if (rename(dst_tmp, dst) != 0) fail("rename", dst);
}

static void record_file(int fd, const struct stat *st, const char *call, const char *rel) {
    char proc[64], tmp[PATH_MAX], dst[PATH_MAX];
    snprintf(proc, sizeof proc, "/proc/self/fd/%d", fd);
    int src = open(proc, O_RDONLY | O_CLOEXEC);  /* fd itself may be write-only */
    if (src < 0) fail("reopen", rel);
    shadow_path(tmp, sizeof tmp, "ino", st->st_ino, ".tmp");
    shadow_path(dst, sizeof dst, "ino", st->st_ino, "");
    struct stat now;
    if (fstat(src, &now) != 0) fail("stat", rel);
    copy_whole(src, now.st_size, tmp, dst);
    close(src);
    note(call, st->st_ino, rel);
}

static void record_dir(int fd, ino_t ino, const char *call, const char *rel) {
    char tmp[PATH_MAX], dst[PATH_MAX];
    int dfd = openat(fd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd < 0) fail("open directory", rel);
    DIR *d = fdopendir(dfd);
    if (!d) fail("read directory", rel);
    shadow_path(tmp, sizeof tmp, "dir", ino, ".tmp");
    shadow_path(dst, sizeof dst, "dir", ino, "");
    FILE *out = fopen(tmp, "we");
    if (!out) fail("open", tmp);
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0) continue;
        struct stat st;
        if (fstatat(dirfd(d), e->d_name, &st, AT_SYMLINK_NOFOLLOW) != 0) continue;  /* gone */
        if (S_ISREG(st.st_mode)) fprintf(out, "f %ju %s\n", (uintmax_t)st.st_ino, e->d_name);
        else if (S_ISDIR(st.st_mode)) fprintf(out, "d %ju %s\n", (uintmax_t)st.st_ino, e->d_name);
    }
    closedir(d);
    fclose(out);
    if (rename(tmp, dst) != 0) fail("rename", dst);
    note(call, ino, rel);
}

static void lock(void) {
    pthread_mutex_lock(&mu);
    while (flock(lock_fd, LOCK_EX) != 0 && errno == EINTR) {}
}

static void unlock(void) {
    flock(lock_fd, LOCK_UN);
    pthread_mutex_unlock(&mu);
}

static void record_fd(int fd, const char *call) {
    char proc[64], path[PATH_MAX], rel[PATH_MAX];
    snprintf(proc, sizeof proc, "/proc/self/fd/%d", fd);
    ssize_t n = readlink(proc, path, sizeof path - 1);
    if (n < 0) return;
    path[n] = 0;
    int saved = errno;
    if (!relative(path, rel, sizeof rel) || skipped(rel)) return;
    struct stat st;
    if (fstat(fd, &st) != 0) return;
    lock();
    if (S_ISREG(st.st_mode)) record_file(fd, &st, call, rel);
    else if (S_ISDIR(st.st_mode)) record_dir(fd, st.st_ino, call, rel);
    unlock();
    errno = saved;
}

int fsync(int fd) {
    resolve();
    int rc = real_fsync(fd);
    if (rc == 0 && active) record_fd(fd, "fsync");
    return rc;
}

int fdatasync(int fd) {
    resolve();
    int rc = real_fdatasync(fd);
    if (rc == 0 && active) record_fd(fd, "fdatasync");
    return rc;
}

/* One mapping's part of an msync: [from, to) of the mapping whose line is `line`. */
static void record_range(const char *file, off_t file_off, size_t len, ino_t ino) {
    char rel[PATH_MAX], dst[PATH_MAX];
    if (!relative(file, rel, sizeof rel) || skipped(rel)) return;
    int src = open(file, O_RDONLY | O_CLOEXEC);
    if (src < 0) return;  /* unlinked since it was mapped: nothing names it */
    struct stat st;
    if (fstat(src, &st) != 0 || st.st_ino != ino) { close(src); return; }
    shadow_path(dst, sizeof dst, "ino", ino, "");
    int out = open(dst, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (out < 0) fail("open", dst);
    if (ftruncate(out, st.st_size) != 0) fail("truncate", dst);
    static char buf[1 << 20];
    off_t end = file_off + (off_t)len < st.st_size ? file_off + (off_t)len : st.st_size;
    for (off_t at = file_off; at < end;) {
        size_t want = (size_t)(end - at) < sizeof buf ? (size_t)(end - at) : sizeof buf;
        ssize_t n = pread(src, buf, want, at);
        if (n <= 0) break;
        if (pwrite(out, buf, (size_t)n, at) != n) fail("write", dst);
        at += n;
    }
    close(out);
    close(src);
    note("msync", ino, rel);
}

static void record_msync(uintptr_t addr, size_t len) {
    FILE *maps = fopen("/proc/self/maps", "re");
    if (!maps) return;
    char line[PATH_MAX + 256];
    uintptr_t end_addr = addr + len;
    lock();
    while (fgets(line, sizeof line, maps)) {
        uintptr_t start, end;
        unsigned long long off, inode;
        char perms[8], dev[32], file[PATH_MAX];
        file[0] = 0;
        if (sscanf(line, "%lx-%lx %7s %llx %31s %llu %4095[^\n]", &start, &end, perms, &off, dev,
                   &inode, file) < 6)
            continue;
        if (end <= addr || start >= end_addr || inode == 0 || file[0] != '/') continue;
        uintptr_t from = addr > start ? addr : start;
        uintptr_t to = end_addr < end ? end_addr : end;
        record_range(file, (off_t)(off + (from - start)), to - from, (ino_t)inode);
    }
    unlock();
    fclose(maps);
}

int msync(void *addr, size_t len, int flags) {
    resolve();
    int rc = real_msync(addr, len, flags);
    if (rc == 0 && active && (flags & MS_SYNC)) {
        int saved = errno;
        record_msync((uintptr_t)addr, len);
        errno = saved;
    }
    return rc;
}

static int record_entry(const char *path, const struct stat *st, int type, struct FTW *ftw) {
    (void)st; (void)ftw;
    if (type != FTW_F && type != FTW_D) return 0;
    int fd = open(path, O_RDONLY | O_CLOEXEC | (type == FTW_D ? O_DIRECTORY : 0));
    if (fd < 0) return 0;
    char rel[PATH_MAX];
    struct stat now;
    if (relative(path, rel, sizeof rel) && !skipped(rel) && fstat(fd, &now) == 0) {
        if (type == FTW_F) record_file(fd, &now, "sync", rel);
        else record_dir(fd, now.st_ino, "sync", rel);
    }
    close(fd);
    return 0;
}

static void record_all(void) {
    lock();
    nftw(root, record_entry, 16, FTW_PHYS);
    unlock();
}

int syncfs(int fd) {
    resolve();
    int rc = real_syncfs(fd);
    if (rc == 0 && active) record_all();
    return rc;
}

void sync(void) {
    resolve();
    real_sync();
    if (active) record_all();
}

/* The boot id, for a process that opens it to tell a reboot from a process crash. */
static const char BOOT_ID_PATH[] = "/proc/sys/kernel/random/boot_id";

static int fake_boot_id(const char *path) {
    if (!active || !boot_id[0] || strcmp(path, BOOT_ID_PATH) != 0) return -1;
    int fd = memfd_create("boot_id", MFD_CLOEXEC);
    if (fd < 0) return -1;
    size_t n = strlen(boot_id);
    if (write(fd, boot_id, n) != (ssize_t)n || lseek(fd, 0, SEEK_SET) != 0) { close(fd); return -1; }
    return fd;
}

static mode_t mode_arg(int flags, va_list ap) {
    return (flags & (O_CREAT | O_TMPFILE)) ? (mode_t)va_arg(ap, int) : 0;
}

int open(const char *path, int flags, ...) {
    resolve();
    va_list ap;
    va_start(ap, flags);
    mode_t mode = mode_arg(flags, ap);
    va_end(ap);
    int fake = fake_boot_id(path);
    return fake >= 0 ? fake : real_open(path, flags, mode);
}

int open64(const char *path, int flags, ...) {
    resolve();
    va_list ap;
    va_start(ap, flags);
    mode_t mode = mode_arg(flags, ap);
    va_end(ap);
    int fake = fake_boot_id(path);
    return fake >= 0 ? fake : real_open(path, flags, mode);
}

int openat(int dirfd, const char *path, int flags, ...) {
    resolve();
    va_list ap;
    va_start(ap, flags);
    mode_t mode = mode_arg(flags, ap);
    va_end(ap);
    int fake = fake_boot_id(path);
    return fake >= 0 ? fake : real_openat(dirfd, path, flags, mode);
}

int openat64(int dirfd, const char *path, int flags, ...) {
    resolve();
    va_list ap;
    va_start(ap, flags);
    mode_t mode = mode_arg(flags, ap);
    va_end(ap);
    int fake = fake_boot_id(path);
    return fake >= 0 ? fake : real_openat(dirfd, path, flags, mode);
}
