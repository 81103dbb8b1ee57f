// Paths as the program shows and compares them (lexical normalisation, relative to the working directory when
// under it), and the command line a user can paste back (the program's own path, shell quoting).
#ifndef DF_BASE_PATH_H
#define DF_BASE_PATH_H

#include <stdbool.h>
#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

// snprintf for paths: false (and out truncated) when the result does not fit.
bool df_pathf(char *out, size_t n, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

// Lexical normalisation, as os.path.normpath: "recipes/../runs/x/" -> "runs/x", "./a//b" -> "a/b"; a relative
// path stays relative (leading ".." kept), "" -> ".". Symbolic links are not followed.
void df_path_normalize(const char *in, char *out, size_t n);
// The absolute normalised path (a relative one is taken from the working directory).
void df_path_absolute(const char *in, char *out, size_t n);
// A path as messages show it: normalised and relative to the working directory when it lies under it
// ("/cwd/sub/../runs/x" and "sub/../runs/x" -> "runs/x", the directory itself -> "."), else absolute
// ("../x" -> "/parent/x"). The result still names the same place from the working directory.
void df_path_shown(const char *in, char *out, size_t n);
// Whether a and b name the same place once both are absolute and normalised.
bool df_path_same(const char *a, const char *b);

// The program's path as the user can paste it: relative to the working directory when inside it ("./build/
// draftforge"), else absolute; "draftforge" when unknown.
void df_self_path(char *out, size_t n);

// Appends s to out (capacity n), single-quoted for a POSIX shell when it holds anything but [A-Za-z0-9_./=:,+-].
void df_shell_quote_append(char *out, size_t n, const char *s);

#ifdef __cplusplus
}
#endif

#endif
