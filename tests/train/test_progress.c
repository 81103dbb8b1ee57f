// The terminal progress line (train/observe/progress.h): in-place redraws, messages printed above the line, the
// throttle, the width cut and the final newline; and the progress text itself (train/observe/metrics_log.h).
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "train/observe/metrics_log.h"
#include "train/observe/progress.h"

typedef struct {
  char *buf;
  size_t len;
  FILE *tty;
  df_progress_term *p;
} screen;

static void screen_open(screen *s, int width) {
  memset(s, 0, sizeof *s);
  s->tty = open_memstream(&s->buf, &s->len);
  df_error err = {0};
  cr_assert_eq(df_progress_term_open(s->tty, width, &s->p, &err), DF_OK, "%s", err.msg);
}

static const char *screen_text(screen *s) {
  fflush(s->tty);
  return s->buf;
}

Test(progress, redraws_in_place_and_prints_messages_above) {
  screen s;
  screen_open(&s, 80);
  df_progress_term_update(s.p, "step 1/9", true);
  cr_expect_str_eq(screen_text(&s), "\rstep 1/9\033[K");
  fprintf(df_progress_term_log(s.p), "eval @ step %d\n", 1);
  // the line is cleared, the message printed, the line drawn again below it
  cr_expect_str_eq(screen_text(&s), "\rstep 1/9\033[K\r\033[Keval @ step 1\n\rstep 1/9\033[K");
  df_progress_term_update(s.p, "step 2/9", true);
  cr_expect(strstr(screen_text(&s), "\n\rstep 1/9\033[K\rstep 2/9\033[K") != NULL, "%s", screen_text(&s));
  size_t before = strlen(screen_text(&s));
  df_progress_term_close(s.p);
  fflush(s.tty);
  cr_expect_eq(s.len, before + 1);
  cr_expect_eq(s.buf[s.len - 1], '\n'); // the last line stays on screen
  fclose(s.tty);
  free(s.buf);
}

Test(progress, throttles_unforced_updates) {
  screen s;
  screen_open(&s, 80);
  df_progress_term_update(s.p, "step 1/9", true);
  size_t n = strlen(screen_text(&s));
  for (int i = 2; i < 50; i++) {
    char line[32];
    snprintf(line, sizeof line, "step %d/9", i);
    df_progress_term_update(s.p, line, false); // all within 0.1 s: none drawn
  }
  cr_expect_eq(strlen(screen_text(&s)), n, "%s", screen_text(&s));
  df_progress_term_close(s.p); // the newest text is drawn before the final newline
  cr_expect(strstr(screen_text(&s), "\rstep 49/9\033[K\n") != NULL, "%s", screen_text(&s));
  fclose(s.tty);
  free(s.buf);
}

Test(progress, cuts_lines_to_the_width_and_waits_for_a_whole_message) {
  screen s;
  screen_open(&s, 10);
  df_progress_term_update(s.p, "0123456789abcdef", true);
  cr_expect_str_eq(screen_text(&s), "\r012345678\033[K"); // width - 1 columns: never wraps
  FILE *log = df_progress_term_log(s.p);
  fputs("half ", log);
  fflush(log);
  df_progress_term_update(s.p, "next", true); // a message is mid-line: not drawn over it
  fputs("done\n", log);
  fflush(log);
  cr_expect_str_eq(screen_text(&s), "\r012345678\033[K\r\033[Khalf done\n\rnext\033[K");
  df_progress_term_close(s.p);
  fclose(s.tty);
  free(s.buf);
}

Test(progress, line_shows_step_loss_acc_tau_lr_rate_and_eta) {
  df_progress p = {.step = 12,
                   .stop = 100,
                   .epoch = 0,
                   .loss = 5.43214,
                   .acc = 0.12344,
                   .tau = 1.9249,
                   .lr = 6e-4,
                   .grad_norm = 1.2344,
                   .tokens_per_s = 12345.0,
                   .eta_s = 65.4};
  char buf[256];
  df_progress_format(&p, buf, sizeof buf);
  cr_expect_str_eq(buf,
                   "step 12/100 | ep 0 | loss 5.4321 | acc 0.1234 | tau 1.92 | lr 6.00e-04 | gnorm 1.234 | 12.3k tok/s "
                   "| ETA 0:01:05");
  p.tokens_per_s = NAN, p.eta_s = NAN;
  df_progress_format(&p, buf, sizeof buf);
  cr_expect(strstr(buf, "| - tok/s | ETA -") != NULL, "%s", buf);
}
