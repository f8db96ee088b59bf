/* LD_PRELOAD into PostgreSQL for the "fsync slowed" fault, a slow disk's
 * flushes without a slow disk: while the file SLOW_FSYNC_CONTROL names holds
 * a number N, every fsync and fdatasync first waits N milliseconds. Each
 * delayed call appends a byte to SLOW_FSYNC_COUNT, so the test can see that
 * the fault reached the server (a shim that never slept would pass unseen).
 * No control file, or 0: the calls go straight through. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

static long delay_ms(void) {
    const char *path = getenv("SLOW_FSYNC_CONTROL");
    if (path == NULL) return 0;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return 0;
    char text[32];
    ssize_t n = read(fd, text, sizeof text - 1);
    close(fd);
    if (n <= 0) return 0;
    text[n] = 0;
    return strtol(text, NULL, 10);
}

static void slow_down(void) {
    int saved = errno;  /* the caller sees the real call's errno only */
    long ms = delay_ms();
    if (ms > 0) {
        struct timespec left = {ms / 1000, (ms % 1000) * 1000000L};
        while (nanosleep(&left, &left) == -1 && errno == EINTR) {}
        const char *count = getenv("SLOW_FSYNC_COUNT");
        int fd = count ? open(count, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644) : -1;
        if (fd >= 0) {
            (void)!write(fd, ".", 1);
            close(fd);
        }
    }
    errno = saved;
}

int fsync(int fd) {
    static int (*real)(int);
    if (real == NULL) real = (int (*)(int))dlsym(RTLD_NEXT, "fsync");
    slow_down();
    return real(fd);
}

int fdatasync(int fd) {
    static int (*real)(int);
    if (real == NULL) real = (int (*)(int))dlsym(RTLD_NEXT, "fdatasync");
    slow_down();
    return real(fd);
}
