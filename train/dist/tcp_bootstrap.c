// The bootstrap exchange (train/dist/tcp_bootstrap.h). Wire format, big-endian:
//   hello  (client → rank 0): magic "DFB1", version, world size, rank, blob length (u32 each), job key (u64)
//   answer (rank 0 → client): magic, status, blob length (u32 each), then the blob when status is OK
// Every socket operation is bounded by a deadline; nothing here can wait forever.
#include "train/dist/tcp_bootstrap.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "train/dist/comm_impl.h" // df_comm_now_s

enum { MAGIC = 0x44464231u, VERSION = 1, HELLO_BYTES = 28, ANSWER_BYTES = 12, CONN_TIMEOUT_S = 5 };
enum { ST_OK = 0, ST_WORLD = 1, ST_JOB = 2, ST_LEN = 3, ST_RANK = 4, ST_DUP = 5 };

static const char *status_text(uint32_t st) {
  switch (st) {
  case ST_WORLD: return "a different world size";
  case ST_JOB: return "a different job (another run's bootstrap uses this port)";
  case ST_LEN: return "a different blob length (another draftforge version?)";
  case ST_RANK: return "a rank outside the world";
  case ST_DUP: return "a rank that already connected (two processes got the same rank)";
  default: return "an unknown status";
  }
}

static void put32(unsigned char *p, uint32_t v) {
  v = htonl(v);
  memcpy(p, &v, 4);
}
static uint32_t get32(const unsigned char *p) {
  uint32_t v;
  memcpy(&v, p, 4);
  return ntohl(v);
}

static int ms_left(double deadline) {
  double left = deadline - df_comm_now_s();
  return left <= 0 ? 0 : left > 1e6 ? 1000000000 : (int)(left * 1000) + 1;
}

// Sends or receives exactly n bytes before the deadline (the socket is non-blocking). False on EOF, error or time.
static bool io_all(int fd, void *buf, size_t n, bool sending, double deadline) {
  unsigned char *p = buf;
  while (n > 0) {
    ssize_t k = sending ? send(fd, p, n, MSG_NOSIGNAL) : recv(fd, p, n, 0);
    if (k > 0) {
      p += k, n -= (size_t)k;
      continue;
    }
    if (k == 0 || (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) return false;
    struct pollfd pfd = {fd, sending ? POLLOUT : POLLIN, 0};
    int ms = ms_left(deadline);
    if (ms == 0 || poll(&pfd, 1, ms) <= 0) return false;
  }
  return true;
}

static void set_nonblocking(int fd) { fcntl(fd, F_SETFL, fcntl(fd, F_GETFL, 0) | O_NONBLOCK); }

// ---- rank 0 --------------------------------------------------------------------------------------------------

static int listen_on(int port, int *why) {
  int fd = socket(AF_INET6, SOCK_STREAM, 0), one = 1, zero = 0;
  if (fd >= 0) { // dual stack: IPv4 clients arrive as mapped addresses
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof zero);
    struct sockaddr_in6 a = {.sin6_family = AF_INET6, .sin6_port = htons((uint16_t)port), .sin6_addr = in6addr_any};
    if (bind(fd, (struct sockaddr *)&a, sizeof a) == 0 && listen(fd, 128) == 0) return set_nonblocking(fd), fd;
    *why = errno;
    close(fd);
    if (*why == EADDRINUSE) return -1;
  }
  fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return *why = errno, -1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port), .sin_addr.s_addr = INADDR_ANY};
  if (bind(fd, (struct sockaddr *)&a, sizeof a) == 0 && listen(fd, 128) == 0) return set_nonblocking(fd), fd;
  *why = errno;
  close(fd);
  return -1;
}

typedef struct {
  const df_tcp_bootstrap_options *o;
  const void *blob;
  size_t len;
  bool *served;
  int remaining;
  char note[200]; // the last refused client, for the timeout message
} server;

// Reads one hello and answers it. Malformed input is dropped silently; a refused rank is noted.
static void serve_one(server *s, int fd, double deadline) {
  unsigned char h[HELLO_BYTES], a[ANSWER_BYTES];
  double conn_deadline = df_comm_now_s() + CONN_TIMEOUT_S;
  if (conn_deadline > deadline) conn_deadline = deadline;
  if (!io_all(fd, h, sizeof h, false, conn_deadline) || get32(h) != MAGIC || get32(h + 4) != VERSION) return;
  uint32_t world = get32(h + 8), rank = get32(h + 12), len = get32(h + 16);
  uint64_t key = ((uint64_t)get32(h + 20) << 32) | get32(h + 24);
  uint32_t st = ST_OK;
  if (world != (uint32_t)s->o->world_size)
    st = ST_WORLD;
  else if (key != s->o->job_key)
    st = ST_JOB;
  else if (len != (uint32_t)s->len)
    st = ST_LEN;
  else if (rank == 0 || rank >= world)
    st = ST_RANK;
  else if (s->served[rank])
    st = ST_DUP;
  put32(a, MAGIC), put32(a + 4, st), put32(a + 8, (uint32_t)s->len);
  bool ok = io_all(fd, a, sizeof a, true, conn_deadline) &&
            (st != ST_OK || io_all(fd, (void *)s->blob, s->len, true, conn_deadline));
  if (st != ST_OK) {
    snprintf(s->note, sizeof s->note, "; a client claiming rank %u of %u was refused: %s", rank, world,
             status_text(st));
    return;
  }
  if (ok) s->served[rank] = true, s->remaining--;
}

static df_status missing_ranks(server *s, df_error *err) {
  char list[256] = "";
  int shown = 0;
  for (int r = 1; r < s->o->world_size; r++) {
    if (s->served[r]) continue;
    size_t n = strlen(list);
    if (shown++ < 16) snprintf(list + n, sizeof list - n, "%s%d", n ? ", " : "", r);
  }
  char where[32];
  for (int r = 1; r < s->o->world_size; r++)
    if (!s->served[r]) {
      snprintf(where, sizeof where, "rank %d", r);
      break;
    }
  return DF_FAIL(err, DF_ERR_IO, where,
                 "start every rank with the same MASTER_ADDR/MASTER_PORT and world size; raise training.dist_timeout "
                 "if they start slowly",
                 "rank 0: %d of %d rank(s) never fetched the bootstrap id from port %d within %.0f s: rank %s%s%s",
                 s->remaining, s->o->world_size - 1, s->o->port, s->o->timeout_s, list, shown > 16 ? ", ..." : "",
                 s->note);
}

static df_status run_server(const df_tcp_bootstrap_options *o, const void *blob, size_t len, df_error *err) {
  int why = 0, lfd = listen_on(o->port, &why);
  if (lfd < 0)
    return DF_FAIL(err, DF_ERR_IO, "MASTER_PORT",
                   why == EADDRINUSE ? "another process holds the port (under torchrun its agent store does: set "
                                       "DRAFTFORGE_BOOTSTRAP_PORT to a free port on every rank)"
                                     : "choose another MASTER_PORT",
                   "rank 0 cannot listen on port %d for the bootstrap: %s", o->port, strerror(why));
  server s = {.o = o, .blob = blob, .len = len, .remaining = o->world_size - 1};
  s.served = calloc((size_t)o->world_size, sizeof *s.served);
  if (!s.served) return close(lfd), DF_FAIL(err, DF_ERR_NOMEM, "bootstrap", NULL, "out of memory");
  double deadline = df_comm_now_s() + o->timeout_s;
  while (s.remaining > 0) {
    struct pollfd pfd = {lfd, POLLIN, 0};
    int ms = ms_left(deadline);
    if (ms == 0) break;
    int k = poll(&pfd, 1, ms);
    if (k < 0 && errno != EINTR) break;
    if (k <= 0) continue;
    int fd = accept(lfd, NULL, NULL);
    if (fd < 0) continue;
    set_nonblocking(fd);
    serve_one(&s, fd, deadline);
    close(fd);
  }
  close(lfd);
  df_status st = s.remaining ? missing_ranks(&s, err) : DF_OK;
  free(s.served);
  return st;
}

// ---- the other ranks -------------------------------------------------------------------------------------------

// One connection attempt to any address of host:port, bounded by the deadline. -1 when nothing accepted.
static int try_connect(const char *host, int port, double deadline) {
  char ps[16];
  snprintf(ps, sizeof ps, "%d", port);
  struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM}, *res = NULL;
  if (getaddrinfo(host, ps, &hints, &res) != 0) return -1;
  int fd = -1;
  for (struct addrinfo *a = res; a && fd < 0; a = a->ai_next) {
    fd = socket(a->ai_family, a->ai_socktype, a->ai_protocol);
    if (fd < 0) continue;
    set_nonblocking(fd);
    if (connect(fd, a->ai_addr, a->ai_addrlen) == 0) break;
    int soerr = errno;
    if (soerr == EINPROGRESS) {
      struct pollfd pfd = {fd, POLLOUT, 0};
      int ms = ms_left(deadline);
      socklen_t sl = sizeof soerr;
      if (ms > 1000) ms = 1000;
      if (poll(&pfd, 1, ms) == 1 && getsockopt(fd, SOL_SOCKET, SO_ERROR, &soerr, &sl) == 0 && soerr == 0) break;
    }
    close(fd);
    fd = -1;
  }
  freeaddrinfo(res);
  return fd;
}

typedef enum { ASK_OK, ASK_RETRY, ASK_FOREIGN } ask_result;

static ask_result ask(const df_tcp_bootstrap_options *o, int fd, void *blob, size_t len, double deadline,
                      uint32_t *status) {
  unsigned char h[HELLO_BYTES], a[ANSWER_BYTES];
  put32(h, MAGIC), put32(h + 4, VERSION), put32(h + 8, (uint32_t)o->world_size), put32(h + 12, (uint32_t)o->rank);
  put32(h + 16, (uint32_t)len), put32(h + 20, (uint32_t)(o->job_key >> 32)), put32(h + 24, (uint32_t)o->job_key);
  if (!io_all(fd, h, sizeof h, true, deadline)) return ASK_RETRY;
  double answer_deadline = df_comm_now_s() + CONN_TIMEOUT_S;
  if (!io_all(fd, a, sizeof a, false, answer_deadline < deadline ? answer_deadline : deadline)) return ASK_RETRY;
  if (get32(a) != MAGIC) return ASK_FOREIGN;
  *status = get32(a + 4);
  if (*status != ST_OK) return ASK_OK;
  if (get32(a + 8) != (uint32_t)len) return *status = ST_LEN, ASK_OK;
  return io_all(fd, blob, len, false, deadline) ? ASK_OK : ASK_RETRY;
}

static df_status run_client(const df_tcp_bootstrap_options *o, void *blob, size_t len, df_error *err) {
  double deadline = df_comm_now_s() + o->timeout_s, pause = 0.05;
  for (;;) {
    int fd = try_connect(o->addr, o->port, deadline);
    if (fd >= 0) {
      uint32_t status = ST_OK;
      ask_result r = ask(o, fd, blob, len, deadline, &status);
      close(fd);
      if (r == ASK_FOREIGN)
        return DF_FAIL(err, DF_ERR_IO, "MASTER_PORT",
                       "another service listens there (under torchrun its agent store holds MASTER_PORT: set "
                       "DRAFTFORGE_BOOTSTRAP_PORT to a free port on every rank)",
                       "rank %d: %s:%d answered, but not as draftforge's bootstrap", o->rank, o->addr, o->port);
      if (r == ASK_OK && status != ST_OK)
        return DF_FAIL(err, DF_ERR_INVALID, "MASTER_ADDR", "check that every rank belongs to this job",
                       "rank %d of %d: rank 0 at %s:%d refused it: %s", o->rank, o->world_size, o->addr, o->port,
                       status_text(status));
      if (r == ASK_OK) return DF_OK;
    }
    double left = deadline - df_comm_now_s();
    if (left <= 0) break;
    struct timespec ts = {0, (long)((pause < left ? pause : left) * 1e9)};
    nanosleep(&ts, NULL);
    pause = pause * 2 > 1.0 ? 1.0 : pause * 2;
  }
  return DF_FAIL(err, DF_ERR_IO, "MASTER_ADDR",
                 "check that rank 0 runs, that MASTER_ADDR/MASTER_PORT are the same on every rank and reachable from "
                 "here; raise training.dist_timeout if rank 0 starts slowly",
                 "rank %d: no bootstrap answer from rank 0 at %s:%d within %.0f s", o->rank, o->addr, o->port,
                 o->timeout_s);
}

df_status df_tcp_bootstrap(const df_tcp_bootstrap_options *o, void *blob, size_t len, df_error *err) {
  if (o->world_size < 1 || o->rank < 0 || o->rank >= o->world_size)
    return DF_FAIL(err, DF_ERR_INVALID, "rank", NULL, "bootstrap: rank %d of world %d", o->rank, o->world_size);
  if (len == 0 || len > DF_TCP_BOOTSTRAP_MAX_BLOB || !blob)
    return DF_FAIL(err, DF_ERR_INVALID, "blob", NULL, "bootstrap: a blob of %zu bytes (1 to %d)", len,
                   DF_TCP_BOOTSTRAP_MAX_BLOB);
  if (o->port < 1 || o->port > 65535)
    return DF_FAIL(err, DF_ERR_INVALID, "MASTER_PORT", "set MASTER_PORT or deployment.trainer.master_port",
                   "bootstrap port %d is not a TCP port", o->port);
  if (o->world_size == 1) return DF_OK;
  if (o->rank == 0) return run_server(o, blob, len, err);
  if (!o->addr || !*o->addr)
    return DF_FAIL(err, DF_ERR_INVALID, "MASTER_ADDR", "set MASTER_ADDR or deployment.trainer.master_addr",
                   "rank %d: no address to reach rank 0 at", o->rank);
  return run_client(o, blob, len, err);
}
