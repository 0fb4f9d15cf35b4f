/*
 * file.c — durable writes: every file dtrain produces (token files, weights,
 * checkpoints, run metadata) appears under its name complete or not at all.
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

dt_status dt_file_write_atomic(const char *path, const dt_file_part *parts, int nparts) {
    char dir[4096], tmp[4096 + 64];
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
