// The refreshing progress line: a fopencookie log stream that clears the line before a message and redraws it
// after, and the throttled in-place update.
#define _GNU_SOURCE // fopencookie
#include "train/observe/progress.h"

#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <time.h>
#include <unistd.h>

struct df_progress_term {
  FILE *tty, *log;
  int width;
  char line[512]; // the latest progress text ("" before the first step)
  bool shown;     // the progress line is on screen, unterminated
  bool midline;   // a message without its newline yet: do not draw over it
  bool stale;     // line is newer than what is on screen (a throttled update)
  double last_draw;
};

static double mono_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

bool df_progress_is_terminal(FILE *fp) {
  const char *term = getenv("TERM");
  return isatty(fileno(fp)) && term && term[0] && strcmp(term, "dumb") != 0;
}

static void draw(df_progress_term *p) {
  // a line wider than the terminal wraps, and "\r" then returns only to the start of its last row
  fprintf(p->tty, "\r%.*s\033[K", p->width - 1, p->line);
  fflush(p->tty);
  p->shown = true, p->stale = false;
  p->last_draw = mono_s();
}

static void clear(df_progress_term *p) {
  if (!p->shown) return;
  fputs("\r\033[K", p->tty);
  p->shown = false;
}

static ssize_t log_write(void *cookie, const char *buf, size_t n) {
  df_progress_term *p = cookie;
  if (!n) return 0;
  if (!p->midline) clear(p);
  fwrite(buf, 1, n, p->tty);
  p->midline = buf[n - 1] != '\n';
  if (!p->midline && p->line[0])
    draw(p);
  else
    fflush(p->tty);
  return (ssize_t)n;
}

df_status df_progress_term_open(FILE *tty, int width, df_progress_term **out, df_error *err) {
  *out = NULL;
  df_progress_term *p = calloc(1, sizeof *p);
  if (!p) return DF_FAIL(err, DF_ERR_NOMEM, "progress", NULL, "out of memory");
  p->tty = tty;
  struct winsize ws;
  if (width <= 0) width = ioctl(fileno(tty), TIOCGWINSZ, &ws) == 0 && ws.ws_col > 0 ? ws.ws_col : 100;
  p->width = width < 2 ? 2 : width;
  p->log = fopencookie(p, "w", (cookie_io_functions_t){.write = log_write});
  if (!p->log) {
    free(p);
    return DF_FAIL(err, DF_ERR_NOMEM, "progress", NULL, "cannot open the progress log stream");
  }
  setvbuf(p->log, NULL, _IOLBF, 0);
  *out = p;
  return DF_OK;
}

FILE *df_progress_term_log(df_progress_term *p) { return p->log; }

void df_progress_term_update(df_progress_term *p, const char *line, bool force) {
  snprintf(p->line, sizeof p->line, "%s", line);
  fflush(p->log); // a message still buffered goes above the line
  if (p->midline || (!force && p->shown && mono_s() - p->last_draw < 0.1)) {
    p->stale = true;
    return;
  }
  draw(p);
}

void df_progress_term_close(df_progress_term *p) {
  if (!p) return;
  fclose(p->log); // flushes (and may redraw)
  if (p->line[0] && (!p->shown || p->stale) && !p->midline) draw(p);
  if (p->shown || p->midline) fputc('\n', p->tty);
  fflush(p->tty);
  free(p);
}
