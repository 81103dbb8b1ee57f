// The TCP bootstrap between real processes on loopback: the test process is rank 0 (or a client), forked
// children are the other ranks. Every rank gets rank 0's bytes; clients may start before the server; a missing
// rank, a mismatched rank, junk connections, a foreign server and a taken port all end with a named error.
#include <arpa/inet.h>
#include <criterion/criterion.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "tests/common/fixture.h"
#include "train/dist/tcp_bootstrap.h"

enum { BLOB = 128 };

static int free_port(void) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  socklen_t len = sizeof a;
  cr_assert(fd >= 0 && bind(fd, (struct sockaddr *)&a, sizeof a) == 0 &&
            getsockname(fd, (struct sockaddr *)&a, &len) == 0);
  close(fd);
  return ntohs(a.sin_port);
}

static void expected_blob(unsigned char *b) {
  for (int i = 0; i < BLOB; i++) b[i] = (unsigned char)(i * 37 + 11);
}

static df_tcp_bootstrap_options opts(int port, int rank, int world, double timeout) {
  return (df_tcp_bootstrap_options){
      .addr = "127.0.0.1", .port = port, .rank = rank, .world_size = world, .job_key = 0xfeedULL, .timeout_s = timeout};
}

// A client child, started after delay_ms. Exit codes: 0 got the right bytes, 2 wrong bytes, 3 failed with the
// expected error text, 1 any other failure.
static pid_t spawn_client(df_tcp_bootstrap_options o, int delay_ms, const char *expect_error) {
  pid_t pid = fork();
  cr_assert(pid >= 0);
  if (pid > 0) return pid;
  usleep((useconds_t)delay_ms * 1000);
  unsigned char got[BLOB] = {0}, want[BLOB];
  expected_blob(want);
  df_error err = {0};
  df_status st = df_tcp_bootstrap(&o, got, BLOB, &err);
  if (st == DF_OK) _exit(memcmp(got, want, BLOB) ? 2 : 0);
  _exit(expect_error && strstr(err.msg, expect_error) ? 3 : 1);
}

static int wait_code(pid_t pid) {
  int st = 0;
  cr_assert_eq(waitpid(pid, &st, 0), pid);
  return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static void serve(int port, int world, double timeout) {
  unsigned char blob[BLOB];
  expected_blob(blob);
  df_tcp_bootstrap_options o = opts(port, 0, world, timeout);
  df_error err = {0};
  DF_ASSERT_OK(df_tcp_bootstrap(&o, blob, BLOB, &err), &err);
}

Test(tcp_bootstrap, every_rank_gets_rank_zeros_bytes, .timeout = 60) {
  int port = free_port(), world = 5;
  pid_t kids[4];
  for (int r = 1; r < world; r++) kids[r - 1] = spawn_client(opts(port, r, world, 20), 0, NULL);
  usleep(300 * 1000); // the clients start first and retry until rank 0 listens
  serve(port, world, 20);
  for (int r = 1; r < world; r++) cr_expect_eq(wait_code(kids[r - 1]), 0, "rank %d", r);
}

Test(tcp_bootstrap, missing_rank_is_named_by_rank_zero, .timeout = 60) {
  int port = free_port();
  pid_t kid = spawn_client(opts(port, 1, 3, 20), 0, NULL);
  unsigned char blob[BLOB];
  expected_blob(blob);
  df_tcp_bootstrap_options o = opts(port, 0, 3, 1.5);
  df_error err = {0};
  cr_assert_eq(df_tcp_bootstrap(&o, blob, BLOB, &err), DF_ERR_IO);
  cr_expect_str_eq(err.where, "rank 2");
  cr_expect(strstr(err.msg, "1 of 2 rank(s) never fetched the bootstrap id") != NULL, "%s", err.msg);
  cr_expect(strstr(err.msg, "within 2 s: rank 2") != NULL, "%s", err.msg);
  cr_expect_eq(wait_code(kid), 0, "rank 1 was served");
}

Test(tcp_bootstrap, client_without_server_names_the_address, .timeout = 60) {
  int port = free_port();
  unsigned char blob[BLOB];
  df_tcp_bootstrap_options o = opts(port, 2, 3, 1.0);
  df_error err = {0};
  cr_assert_eq(df_tcp_bootstrap(&o, blob, BLOB, &err), DF_ERR_IO);
  cr_expect_str_eq(err.where, "MASTER_ADDR");
  char want[96];
  snprintf(want, sizeof want, "rank 2: no bootstrap answer from rank 0 at 127.0.0.1:%d within 1 s", port);
  cr_expect(strstr(err.msg, want) != NULL, "%s", err.msg);
}

// The refused clients come first; the right rank 1 comes 1.5 s later, so rank 0 is still serving when they arrive.
Test(tcp_bootstrap, mismatched_clients_are_refused_and_told_why, .timeout = 60) {
  int port = free_port();
  df_tcp_bootstrap_options wrong_world = opts(port, 1, 3, 20), other_job = opts(port, 1, 2, 20);
  other_job.job_key = 0xbad;
  pid_t a = spawn_client(wrong_world, 0, "refused it: a different world size");
  pid_t b = spawn_client(other_job, 0, "refused it: a different job");
  pid_t good = spawn_client(opts(port, 1, 2, 20), 1500, NULL);
  usleep(300 * 1000);
  serve(port, 2, 20);
  cr_expect_eq(wait_code(good), 0);
  cr_expect_eq(wait_code(a), 3, "the wrong world size is refused with the reason");
  cr_expect_eq(wait_code(b), 3, "another job's client is refused with the reason");
}

// Two processes claim rank 1 before rank 0 listens: one is served, the other refused; rank 2 comes last.
Test(tcp_bootstrap, duplicate_rank_is_refused, .timeout = 60) {
  int port = free_port();
  const char *why = "two processes got the same rank";
  pid_t first = spawn_client(opts(port, 1, 3, 20), 0, why), dup = spawn_client(opts(port, 1, 3, 20), 0, why);
  pid_t last = spawn_client(opts(port, 2, 3, 20), 1500, NULL);
  usleep(300 * 1000);
  serve(port, 3, 20);
  int c1 = wait_code(first), c2 = wait_code(dup);
  cr_expect((c1 == 0 && c2 == 3) || (c1 == 3 && c2 == 0), "one rank-1 client is served, the other refused: %d %d", c1,
            c2);
  cr_expect_eq(wait_code(last), 0);
}

// Junk on the port (a scanner, another protocol) is dropped; the exchange goes on.
Test(tcp_bootstrap, junk_connections_do_not_disturb_it, .timeout = 60) {
  int port = free_port();
  pid_t junk = fork();
  cr_assert(junk >= 0);
  if (junk == 0) {
    usleep(100 * 1000);
    for (int k = 0; k < 3; k++) {
      int fd = socket(AF_INET, SOCK_STREAM, 0);
      struct sockaddr_in a = {
          .sin_family = AF_INET, .sin_port = htons((uint16_t)port), .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
      if (connect(fd, (struct sockaddr *)&a, sizeof a) == 0) {
        const char http[] = "GET / HTTP/1.0\r\n\r\n_______"; // 28 bytes of the wrong magic
        if (send(fd, http, sizeof http - 1, MSG_NOSIGNAL) < 0) _exit(1);
      }
      close(fd);
    }
    _exit(0);
  }
  pid_t kid = spawn_client(opts(port, 1, 2, 20), 0, NULL);
  usleep(50 * 1000);
  serve(port, 2, 20);
  cr_expect_eq(wait_code(kid), 0);
  wait_code(junk);
}

// Something else answers on the port (torchrun's agent store, say): the client says so instead of waiting.
Test(tcp_bootstrap, foreign_server_is_recognised, .timeout = 60) {
  int port = free_port();
  int lfd = socket(AF_INET, SOCK_STREAM, 0), one = 1;
  setsockopt(lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  struct sockaddr_in a = {
      .sin_family = AF_INET, .sin_port = htons((uint16_t)port), .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  cr_assert(bind(lfd, (struct sockaddr *)&a, sizeof a) == 0 && listen(lfd, 4) == 0);
  pid_t srv = fork();
  cr_assert(srv >= 0);
  if (srv == 0) {
    int fd = accept(lfd, NULL, NULL);
    char buf[28];
    if (fd >= 0 && recv(fd, buf, sizeof buf, MSG_WAITALL) >= 0 && send(fd, "HTTP/1.0 400 Bad\r\n", 18, 0) < 0) _exit(1);
    usleep(200 * 1000);
    _exit(0);
  }
  close(lfd);
  unsigned char blob[BLOB];
  df_tcp_bootstrap_options o = opts(port, 1, 2, 10);
  df_error err = {0};
  cr_assert_eq(df_tcp_bootstrap(&o, blob, BLOB, &err), DF_ERR_IO);
  cr_expect(strstr(err.msg, "answered, but not as draftforge's bootstrap") != NULL, "%s", err.msg);
  cr_expect(strstr(err.hint, "DRAFTFORGE_BOOTSTRAP_PORT") != NULL, "%s", err.hint);
  wait_code(srv);
}

Test(tcp_bootstrap, taken_port_is_reported_with_the_torchrun_hint) {
  int lfd = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_ANY)};
  socklen_t len = sizeof a;
  cr_assert(bind(lfd, (struct sockaddr *)&a, sizeof a) == 0 && listen(lfd, 4) == 0 &&
            getsockname(lfd, (struct sockaddr *)&a, &len) == 0);
  unsigned char blob[BLOB] = {1};
  df_tcp_bootstrap_options o = opts(ntohs(a.sin_port), 0, 2, 5);
  df_error err = {0};
  cr_assert_eq(df_tcp_bootstrap(&o, blob, BLOB, &err), DF_ERR_IO);
  cr_expect(strstr(err.msg, "cannot listen on port") != NULL, "%s", err.msg);
  cr_expect(strstr(err.hint, "DRAFTFORGE_BOOTSTRAP_PORT") != NULL, "%s", err.hint);
  close(lfd);
}

Test(tcp_bootstrap, arguments) {
  unsigned char blob[BLOB] = {0};
  df_error err = {0};
  df_tcp_bootstrap_options o = opts(29500, 0, 1, 1);
  DF_ASSERT_OK(df_tcp_bootstrap(&o, blob, BLOB, &err), &err); // world 1: nothing to do
  o = opts(29500, 2, 2, 1);
  cr_expect_eq(df_tcp_bootstrap(&o, blob, BLOB, &err), DF_ERR_INVALID);
  o = opts(0, 1, 2, 1);
  cr_expect_eq(df_tcp_bootstrap(&o, blob, BLOB, &err), DF_ERR_INVALID);
  cr_expect_str_eq(err.where, "MASTER_PORT");
  o = opts(29500, 1, 2, 1);
  cr_expect_eq(df_tcp_bootstrap(&o, blob, 0, &err), DF_ERR_INVALID);
  o.addr = "";
  cr_expect_eq(df_tcp_bootstrap(&o, blob, BLOB, &err), DF_ERR_INVALID);
  cr_expect_str_eq(err.where, "MASTER_ADDR");
}
