/* Benchmark aid for more ranks than cores (see ring_wait.py): when a non-blocking socket has
 * nothing to read or no room to write, wait on it (up to WAIT_US) instead of returning at once,
 * so MLX's ring socket thread, which retries in a tight loop, gives its core to the rank that
 * is computing. Data and errors pass through unchanged; only when a retry happens moves. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <poll.h>
#include <sys/socket.h>
#include <time.h>

#define WAIT_US 1000

static void wait_on(int fd, short events) {
  struct pollfd p = {fd, events, 0};
  struct timespec t = {0, WAIT_US * 1000};
  int saved = errno;
  ppoll(&p, 1, &t, NULL);
  errno = saved;
}

ssize_t recv(int fd, void *buf, size_t n, int flags) {
  static ssize_t (*real)(int, void *, size_t, int);
  if (!real) real = (ssize_t (*)(int, void *, size_t, int))dlsym(RTLD_NEXT, "recv");
  ssize_t r = real(fd, buf, n, flags);
  if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK) && !(flags & MSG_DONTWAIT))
    wait_on(fd, POLLIN);
  return r;
}

ssize_t send(int fd, const void *buf, size_t n, int flags) {
  static ssize_t (*real)(int, const void *, size_t, int);
  if (!real) real = (ssize_t (*)(int, const void *, size_t, int))dlsym(RTLD_NEXT, "send");
  ssize_t r = real(fd, buf, n, flags);
  if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK) && !(flags & MSG_DONTWAIT))
    wait_on(fd, POLLOUT);
  return r;
}
