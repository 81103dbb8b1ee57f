// cu_rewrite: turns a CUDA source (kernels/cuda/*.cu) into C++ for the CUDA emulator (DF_CUDA=EMU), at build time.
//   cu_rewrite IN.cu OUT.cpp SHOWN_PATH
// Three rewrites, each keeping every line where it was (so `#line 1 "SHOWN_PATH"` makes diagnostics and __LINE__
// point at the .cu):
//   kernel<T, U><<<grid, block, smem, stream>>>(args)
//     → ::df_emu::launch(kernel<T, U>, "kernel<T, U>", "SHOWN_PATH", LINE).cfg(grid, block, smem, stream)(args)
//     (the kernel expression may span lines; the launch may sit inside a macro argument);
//   __shared__ [__align__(N)] T name[D]...;  → auto &name = ::df_emu::shared<T[D]...>(KEY, __PRETTY_FUNCTION__, "name",
//   N); extern __shared__ [__align__(N)] T name[]; → T *name = (T *)::df_emu::dyn_smem(N);
// Whatever it does not understand stops the build with FILE:LINE: a launch whose kernel is not a (qualified,
// templated) name, a __shared__ line declaring several variables or with an initializer, __shared__ outside a
// function, inline assembly. Comments, string and character literals are left alone.
#include <ctype.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *g_shown;
static const char *src;
static size_t n;
static char *code; // code[i]: src[i] is code (not in a comment or a literal)

typedef struct {
  size_t pos, len;
  char *text;
} edit;

static edit *edits;
static size_t nedits, capedits;

static int line_of(size_t pos) {
  int l = 1;
  for (size_t i = 0; i < pos && i < n; i++) l += src[i] == '\n';
  return l;
}

static void die(size_t pos, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fprintf(stderr, "%s:%d: error: cu_rewrite: ", g_shown, line_of(pos));
  vfprintf(stderr, fmt, ap);
  fprintf(stderr, "\n");
  va_end(ap);
  exit(1);
}

static void add_edit(size_t pos, size_t len, const char *fmt, ...) {
  if (nedits == capedits) {
    capedits = capedits ? 2 * capedits : 64;
    edits = realloc(edits, capedits * sizeof *edits);
  }
  char buf[4096];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  edits[nedits++] = (edit){pos, len, strdup(buf)};
}

// Marks what is code: skips // and /* */ comments, "..." and '...' literals and raw strings R"d(...)d".
static void scan_code(void) {
  code = calloc(n + 1, 1);
  size_t i = 0;
  while (i < n) {
    if (src[i] == '/' && i + 1 < n && src[i + 1] == '/') {
      while (i < n && src[i] != '\n') i++;
    } else if (src[i] == '/' && i + 1 < n && src[i + 1] == '*') {
      i += 2;
      while (i + 1 < n && !(src[i] == '*' && src[i + 1] == '/')) i++;
      i += 2;
    } else if (src[i] == 'R' && i + 1 < n && src[i + 1] == '"' &&
               (i == 0 || !(isalnum((unsigned char)src[i - 1]) || src[i - 1] == '_'))) {
      size_t d0 = i + 2, d1 = d0;
      while (d1 < n && src[d1] != '(') d1++;
      char close[40];
      snprintf(close, sizeof close, ")%.*s\"", (int)(d1 - d0), src + d0);
      const char *end = strstr(src + d1, close);
      i = end ? (size_t)(end - src) + strlen(close) : n;
    } else if (src[i] == '"' || (src[i] == '\'' && !(i > 0 && isxdigit((unsigned char)src[i - 1])))) {
      const char q = src[i++];
      while (i < n && src[i] != q) i += src[i] == '\\' ? 2 : 1;
      i++;
    } else {
      code[i++] = 1;
    }
  }
}

static bool ident(char c) { return isalnum((unsigned char)c) || c == '_'; }

// The token word at i (code, identifier boundaries on both sides).
static bool word_at(size_t i, const char *w) {
  const size_t l = strlen(w);
  if (i + l > n || memcmp(src + i, w, l) || !code[i]) return false;
  if (i > 0 && ident(src[i - 1])) return false;
  return i + l == n || !ident(src[i + l]);
}

static size_t skip_ws_back(size_t i) { // i: one past; returns index of the last non-space before i, or SIZE_MAX
  while (i > 0 && isspace((unsigned char)src[i - 1])) i--;
  return i == 0 ? SIZE_MAX : i - 1;
}

static size_t skip_ws(size_t i) {
  while (i < n && (isspace((unsigned char)src[i]) || !code[i])) i++;
  return i;
}

// ---- launches -------------------------------------------------------------------------------------------------------

static size_t kernel_start(size_t lt) {
  size_t i = skip_ws_back(lt);
  if (i == SIZE_MAX) die(lt, "a launch with no kernel before <<<");
  if (src[i] == '>') { // template arguments
    int angle = 0, paren = 0;
    for (;; i--) {
      if (!code[i]) continue;
      const char c = src[i];
      if (c == ')')
        paren++;
      else if (c == '(')
        paren--;
      else if (paren == 0 && c == '>')
        angle++;
      else if (paren == 0 && c == '<' && --angle == 0)
        break;
      if (i == 0) die(lt, "unbalanced template arguments before <<<");
    }
    i = skip_ws_back(i);
    if (i == SIZE_MAX) die(lt, "a launch with no kernel before <<<");
  }
  for (;;) {
    if (!ident(src[i])) die(lt, "the kernel of this launch is not a name (write name<<<...>>> or name<T><<<...>>>)");
    while (i > 0 && ident(src[i - 1])) i--;
    const size_t start = i;
    size_t j = skip_ws_back(start);
    if (j != SIZE_MAX && j > 0 && src[j] == ':' && src[j - 1] == ':') { // a qualified name
      j = skip_ws_back(j - 1);
      if (j == SIZE_MAX || !ident(src[j])) return j == SIZE_MAX ? 0 : j + 1; // ::name
      i = j;
      continue;
    }
    if (j != SIZE_MAX && (src[j] == '.' || (src[j] == '>' && j > 0 && src[j - 1] == '-')))
      die(lt, "a kernel reached through an object (x.k<<<...>>>) cannot be rewritten");
    return start;
  }
}

static void rewrite_launch(size_t lt) {
  const size_t ks = kernel_start(lt);
  // The end of the configuration: >>> at bracket depth 0.
  int depth = 0;
  size_t gt = 0;
  for (size_t i = lt + 3; i + 2 < n; i++) {
    if (!code[i]) continue;
    const char c = src[i];
    if (c == '(' || c == '[' || c == '{')
      depth++;
    else if (c == ')' || c == ']' || c == '}')
      depth--;
    else if (c == ';' && depth == 0)
      break;
    else if (depth == 0 && c == '>' && src[i + 1] == '>' && src[i + 2] == '>') {
      gt = i;
      break;
    }
    if (depth < 0) break;
  }
  if (!gt) die(lt, "no >>> closes this launch configuration");
  const size_t args = skip_ws(gt + 3);
  if (args >= n || src[args] != '(') die(lt, "a launch must be followed by its argument list: kernel<<<...>>>(...)");
  char name[512];
  size_t k = 0;
  for (size_t i = ks; i < lt && k + 2 < sizeof name; i++) {
    if (!code[i]) continue;
    if (isspace((unsigned char)src[i])) {
      if (k && name[k - 1] != ' ' && name[k - 1] != '<') name[k++] = ' ';
    } else {
      if (src[i] == '>' && k && name[k - 1] == ' ') k--;
      name[k++] = src[i];
    }
  }
  while (k && name[k - 1] == ' ') k--;
  name[k] = 0;
  add_edit(ks, 0, "::df_emu::launch(");
  add_edit(lt, 3, ", \"%s\", \"%s\", %d).cfg(", name, g_shown, line_of(lt));
  add_edit(gt, 3, ")");
}

// ---- __shared__ ---------------------------------------------------------------------------------------------------

// Whether position i is inside a function body: some enclosing brace opens code, not a namespace or extern "C".
static bool in_function(size_t pos) {
  bool kinds[512]; // true: a code brace
  int depth = 0;
  for (size_t i = 0; i < pos; i++) {
    if (!code[i]) continue;
    if (src[i] == '{') {
      size_t j = skip_ws_back(i);
      bool ns = false;
      // namespace [name] {   or   extern "C" {
      size_t w = j;
      while (w != SIZE_MAX && w > 0 && ident(src[w])) w--;
      size_t w2 = skip_ws_back(w + (ident(src[w]) ? 0 : 1));
      if (j != SIZE_MAX && j >= 8 && !memcmp(src + j - 8, "namespace", 9)) ns = true;
      if (!ns && w2 != SIZE_MAX && w2 >= 8 && !memcmp(src + w2 - 8, "namespace", 9)) ns = true;
      if (!ns && j != SIZE_MAX && src[j] == '"') ns = true; // extern "C" {
      if (depth < 512) kinds[depth] = !ns;
      depth++;
    } else if (src[i] == '}') {
      depth--;
    }
  }
  for (int d = 0; d < depth && d < 512; d++)
    if (kinds[d]) return true;
  return false;
}

static void trim(const char **b, const char **e) {
  while (*b < *e && isspace((unsigned char)**b)) (*b)++;
  while (*e > *b && isspace((unsigned char)(*e)[-1])) (*e)--;
}

static uint64_t fnv(const char *s) {
  uint64_t h = 1469598103934665603ull;
  for (; *s; s++) h = (h ^ (uint8_t)*s) * 1099511628211ull;
  return h;
}

static void rewrite_shared(size_t at) {
  if (!in_function(at)) die(at, "__shared__ outside a function: the emulator gives shared memory to kernels only");
  // A storage keyword right before it belongs to the declaration.
  size_t start = at;
  bool ext = false;
  size_t j = skip_ws_back(at);
  if (j != SIZE_MAX && j >= 5 && word_at(j - 5, "extern"))
    ext = true, start = j - 5;
  else if (j != SIZE_MAX && j >= 5 && word_at(j - 5, "static"))
    start = j - 5;
  size_t semi = at + strlen("__shared__");
  int depth = 0;
  for (; semi < n; semi++) {
    if (!code[semi]) continue;
    const char c = src[semi];
    if (c == '(' || c == '[')
      depth++;
    else if (c == ')' || c == ']')
      depth--;
    else if (depth == 0 && c == ';')
      break;
    else if (depth == 0 && (c == '{' || c == '}'))
      die(at, "a __shared__ declaration not ended by ';'");
    else if (depth == 0 && c == ',')
      die(at, "several variables in one __shared__ declaration: declare one per line (split the line)");
    else if (depth == 0 && c == '=')
      die(at, "a __shared__ variable with an initializer (CUDA does not allow one)");
  }
  if (semi >= n) die(at, "a __shared__ declaration not ended by ';'");
  // The declaration text, without __align__(N) (the alignment is kept apart).
  char decl[1024];
  size_t k = 0;
  unsigned align = 0;
  for (size_t i = at + strlen("__shared__"); i < semi && k + 2 < sizeof decl; i++) {
    if (word_at(i, "__align__")) {
      size_t p = skip_ws(i + 9);
      if (src[p] != '(') die(at, "__align__ without (N)");
      align = (unsigned)strtoul(src + p + 1, NULL, 0);
      while (p < semi && src[p] != ')') p++;
      i = p;
      continue;
    }
    if (word_at(i, "extern") || word_at(i, "static")) die(at, "write the storage class before __shared__");
    decl[k++] = src[i] == '\n' ? ' ' : src[i];
  }
  decl[k] = 0;
  const char *b = decl, *e = decl + k;
  trim(&b, &e);
  const char *lb = memchr(b, '[', (size_t)(e - b));
  const char *head_end = lb ? lb : e;
  const char *hb = b, *he = head_end;
  trim(&hb, &he);
  const char *nb = he;
  while (nb > hb && ident(nb[-1])) nb--;
  if (nb == he || nb == hb) die(at, "a __shared__ declaration cu_rewrite does not understand (expected: T name[...];)");
  char type[512], name[128], dims[512];
  snprintf(type, sizeof type, "%.*s", (int)(nb - hb), hb);
  snprintf(name, sizeof name, "%.*s", (int)(he - nb), nb);
  snprintf(dims, sizeof dims, "%.*s", lb ? (int)(e - lb) : 0, lb ? lb : "");
  for (size_t t = strlen(type); t > 0 && isspace((unsigned char)type[t - 1]); t--) type[t - 1] = 0;
  int newlines = 0;
  for (size_t i = start; i <= semi; i++) newlines += src[i] == '\n';
  char nl[64];
  memset(nl, '\n', (size_t)newlines < sizeof nl - 1 ? (size_t)newlines : sizeof nl - 1);
  nl[newlines < 63 ? newlines : 63] = 0;
  if (ext) {
    if (strcmp(dims, "[]") != 0) die(at, "extern __shared__ must be an array of unknown size: T name[];");
    add_edit(start, semi + 1 - start, "%s *%s = (%s *)::df_emu::dyn_smem(%u);%s", type, name, type, align ? align : 16,
             nl);
  } else {
    char keyname[700];
    snprintf(keyname, sizeof keyname, "%s:%d:%s", g_shown, line_of(at), name);
    add_edit(start, semi + 1 - start,
             "auto &%s = ::df_emu::shared<%s%s>(0x%016llxull, __PRETTY_FUNCTION__, \"%s\", %u);%s", name, type, dims,
             (unsigned long long)fnv(keyname), name, align, nl);
  }
}

// ---- driver -------------------------------------------------------------------------------------------------------

static int by_pos(const void *a, const void *b) {
  const edit *x = a, *y = b;
  return x->pos < y->pos ? -1 : x->pos > y->pos;
}

int main(int argc, char **argv) {
  if (argc != 4) {
    fprintf(stderr, "usage: cu_rewrite IN.cu OUT.cpp SHOWN_PATH\n");
    return 2;
  }
  g_shown = argv[3];
  FILE *f = fopen(argv[1], "rb");
  if (!f) {
    perror(argv[1]);
    return 1;
  }
  fseek(f, 0, SEEK_END);
  n = (size_t)ftell(f);
  fseek(f, 0, SEEK_SET);
  char *buf = malloc(n + 1);
  if (fread(buf, 1, n, f) != n) {
    perror(argv[1]);
    return 1;
  }
  buf[n] = 0;
  fclose(f);
  src = buf;
  scan_code();
  for (size_t i = 0; i + 2 < n; i++) {
    if (!code[i]) continue;
    if (src[i] == '<' && src[i + 1] == '<' && src[i + 2] == '<') {
      rewrite_launch(i);
      i += 2;
    } else if (word_at(i, "__shared__")) {
      rewrite_shared(i);
    } else if (word_at(i, "asm") || word_at(i, "__asm__") || word_at(i, "__asm")) {
      die(i, "inline assembly (PTX) cannot run in the CUDA emulator");
    } else if (word_at(i, "cooperative_groups")) {
      die(i, "cooperative groups are not emulated");
    }
  }
  qsort(edits, nedits, sizeof *edits, by_pos);
  FILE *o = fopen(argv[2], "wb");
  if (!o) {
    perror(argv[2]);
    return 1;
  }
  fprintf(o, "#include \"kernels/cuda/emu/prelude.h\"\n#line 1 \"%s\"\n", g_shown);
  size_t at = 0;
  for (size_t e = 0; e < nedits; e++) {
    if (edits[e].pos < at) die(edits[e].pos, "overlapping rewrites (a launch inside a __shared__ declaration?)");
    fwrite(src + at, 1, edits[e].pos - at, o);
    fputs(edits[e].text, o);
    at = edits[e].pos + edits[e].len;
  }
  fwrite(src + at, 1, n - at, o);
  if (fclose(o) != 0) {
    perror(argv[2]);
    return 1;
  }
  return 0;
}
