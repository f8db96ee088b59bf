/* Preloaded before libfaketime in the clock-skew test: libfaketime 0.9.10
 * translates absolute timerfd deadlines as if every clock were the faked
 * wall clock, so timers on CLOCK_MONOTONIC and CLOCK_BOOTTIME (libdispatch's,
 * which run Swift's Task.sleep) fire at once or minutes late. This passes
 * those straight to the kernel: only the wall clock is skewed, as on a
 * machine whose clock is wrong. Built by integration/chaos/cluster.py. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <sys/syscall.h>
#include <sys/timerfd.h>
#include <time.h>
#include <unistd.h>

#define MAX_FDS 65536
static unsigned char wall_clock[MAX_FDS];

int timerfd_create(int clockid, int flags) {
    int fd = (int)syscall(SYS_timerfd_create, clockid, flags);
    if (fd >= 0 && fd < MAX_FDS) wall_clock[fd] = (clockid == CLOCK_REALTIME || clockid == CLOCK_REALTIME_ALARM);
    return fd;
}

int timerfd_settime(int fd, int flags, const struct itimerspec *new_value, struct itimerspec *old_value) {
    if (fd >= 0 && fd < MAX_FDS && wall_clock[fd]) {
        int (*next)(int, int, const struct itimerspec *, struct itimerspec *) = dlsym(RTLD_NEXT, "timerfd_settime");
        return next(fd, flags, new_value, old_value);
    }
    return (int)syscall(SYS_timerfd_settime, fd, flags, new_value, old_value);
}
