/*
 * file.c — durable writes: every file dtrain produces (token files, weights,
 * checkpoints, run metadata) appears under its name complete or not at all,
 * and never replaces something that is not a regular file; and the checks
 * every reader of a dtrain file format shares (a regular file, nothing
 * after its end).
 */
#include "dtrain/core.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static dt_status file_error(const char *what, const char *path) {
    int e = errno;
    dt_status st = (e == ENOSPC || e == EDQUOT) ? DT_ERR_NOSPACE : DT_ERR_IO;
    return dt_error_set(st, "%s %s: %s", what, path, strerror(e));
}

dt_status dt_file_write_all(int fd, const void *data, size_t len, const char *path) {
    const char *p = data;
    while (len > 0) {
        size_t chunk = len < (1u << 30) ? len : (1u << 30);
        ssize_t n = write(fd, p, chunk);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0) {
            if (n == 0)
                errno = ENOSPC; /* a write that makes no progress: the disk is full */
            return file_error("cannot write", path);
        }
        p += n;
        len -= (size_t)n;
    }
    return DT_OK;
}

dt_status dt_fsync_dir(const char *dir) {
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0)
        return file_error("cannot open directory", dir);
    dt_status st = DT_OK;
    if (fsync(fd) != 0 && errno != EINVAL && errno != ENOTSUP)
        st = file_error("cannot fsync directory", dir);
    close(fd);
    return st;
}

static const char *kind_of(mode_t m) {
    return S_ISDIR(m)    ? "a directory"
           : S_ISCHR(m)  ? "a character device"
           : S_ISBLK(m)  ? "a block device"
           : S_ISFIFO(m) ? "a FIFO"
           : S_ISSOCK(m) ? "a socket"
                         : "a special file";
}

dt_status dt_file_check_replaceable(const char *path) {
    struct stat sb;
    if (stat(path, &sb) != 0) {
        if (errno == ENOENT)
            return DT_OK; /* absent (or a dangling link): the rename creates it */
        return file_error("cannot stat", path);
    }
    if (S_ISREG(sb.st_mode))
        return DT_OK;
    return dt_error_set(DT_ERR_INVALID,
                        "refusing to replace %s: it is %s, not a regular file (choose another "
                        "output path)",
                        path, kind_of(sb.st_mode));
}

dt_status dt_file_open_read(const char *path, const char *what, FILE **out) {
    *out = NULL;
    /* Non-blocking: opening a FIFO must not wait for a writer; it is
     * refused below like any other file that is not regular. */
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) {
        if (errno == ENOENT)
            return dt_error_set(DT_ERR_NOT_FOUND, "%s %s does not exist", what, path);
        return dt_error_set_errno(DT_ERR_IO, "cannot open %s %s", what, path);
    }
    struct stat sb;
    if (fstat(fd, &sb) != 0) {
        dt_status st = dt_error_set_errno(DT_ERR_IO, "cannot stat %s %s", what, path);
        close(fd);
        return st;
    }
    if (!S_ISREG(sb.st_mode)) {
        close(fd);
        return dt_error_set(DT_ERR_INVALID, "%s %s is %s, not a regular file", what, path,
                            kind_of(sb.st_mode));
    }
    FILE *f = fdopen(fd, "rb");
    if (!f) {
        dt_status st = dt_error_set_errno(DT_ERR_IO, "cannot open %s %s", what, path);
        close(fd);
        return st;
    }
    *out = f;
    return DT_OK;
}

dt_status dt_file_expect_end(FILE *f, const char *what, const char *path) {
    if (fgetc(f) == EOF)
        return ferror(f) ? dt_error_set(DT_ERR_IO, "cannot read %s %s", what, path) : DT_OK;
    long at = ftell(f) - 1;
    struct stat sb;
    if (at >= 0 && fstat(fileno(f), &sb) == 0 && sb.st_size > at)
        return dt_error_set(DT_ERR_CORRUPT,
                            "%s %s: %lld bytes of trailing data after its end at byte %ld "
                            "(damaged, or two files joined)",
                            what, path, (long long)(sb.st_size - at), at);
    return dt_error_set(DT_ERR_CORRUPT, "%s %s: trailing data after its end", what, path);
}

dt_status dt_file_write_atomic(const char *path, const dt_file_part *parts, int nparts) {
    char dir[4096], tmp[4096 + 64];
    DT_CHECK(dt_file_check_replaceable(path));
    const char *slash = strrchr(path, '/');
    const char *base = slash ? slash + 1 : path;
    if (!slash)
        snprintf(dir, sizeof dir, ".");
    else if (slash == path)
        snprintf(dir, sizeof dir, "/");
    else if ((size_t)(slash - path) < sizeof dir)
        snprintf(dir, sizeof dir, "%.*s", (int)(slash - path), path);
    else
        return dt_error_set(DT_ERR_INVALID, "path too long: %s", path);
    if (snprintf(tmp, sizeof tmp, "%s/.%s.tmp.%ld", dir, base, (long)getpid()) >= (int)sizeof tmp)
        return dt_error_set(DT_ERR_INVALID, "path too long: %s", path);
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0)
        return file_error("cannot create", tmp);
    dt_status st = DT_OK;
    for (int i = 0; i < nparts && st == DT_OK; i++)
        st = dt_file_write_all(fd, parts[i].data, parts[i].len, path);
    if (st == DT_OK && fsync(fd) != 0)
        st = file_error("cannot fsync", path);
    if (close(fd) != 0 && st == DT_OK)
        st = file_error("cannot close", path);
    if (st == DT_OK && rename(tmp, path) != 0)
        st = file_error("cannot rename to", path);
    if (st != DT_OK) {
        unlink(tmp);
        return st;
    }
    return dt_fsync_dir(dir);
}

dt_status dt_mkdir_p(const char *dir) {
    char p[4096];
    if (snprintf(p, sizeof p, "%s", dir) >= (int)sizeof p)
        return dt_error_set(DT_ERR_INVALID, "directory name too long: %s", dir);
    for (char *s = p + 1; *s; s++) {
        if (*s != '/')
            continue;
        *s = '\0';
        if (mkdir(p, 0755) != 0 && errno != EEXIST)
            return file_error("cannot create directory", p);
        *s = '/';
    }
    if (mkdir(p, 0755) != 0 && errno != EEXIST)
        return file_error("cannot create directory", p);
    struct stat sb;
    if (stat(p, &sb) != 0 || !S_ISDIR(sb.st_mode))
        return dt_error_set(DT_ERR_IO, "%s exists and is not a directory", p);
    return DT_OK;
}
