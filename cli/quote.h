/* quote.h: how kcache writes names it did not choose (file names, mount paths) in each of its outputs.
 *
 * A name in the cache is whatever a user's program made it: any byte but '/' and NUL, valid UTF-8 or not,
 * newlines and terminal escapes included. Printed raw, a newline forges a row of a listing and an escape
 * sequence reaches the operator's terminal. So every such name goes through one of these, never through
 * a bare %s; what each writes is documented in kcache(1), NAMES. */
#pragma once

#include <stddef.h>
#include <stdio.h>

/* Plain output: the name as is when it has only characters that need no quoting in a POSIX shell
 * (letters, digits, "%+,-./:=@_", and printable non-ASCII UTF-8), else quoted as GNU ls's shell-escape
 * style does: '...' around printable runs, $'\n', $'\033', $'\377' for control characters and bytes that
 * are not UTF-8, \' for a quote. The result never holds a control character and pastes back into bash,
 * zsh or ksh as the exact name. */
void kc_put_shell(FILE *f, const char *s);
/* JSON: kcache's JSON is made by json-c; kc_json_write gives every string of the tree these rules in
 * place of json-c's (which passes bytes that are not UTF-8 through, and so would write invalid JSON).
 * A string literal with its quotes: \" \\ \b \f \n \r \t, other controls (C0, DEL, C1) as \u00XX,
 * U+2028/U+2029 escaped; each byte XX that is not part of valid UTF-8 as \udcXX, the lone surrogate of
 * Python's surrogateescape (os.fsencode(json.loads(...)) gives the bytes back; valid UTF-8 never holds a
 * surrogate, so the mapping is unambiguous). The tree is written on one line, without a newline.
 * 0, or -EIO when f has failed (errno, where the stream set one, is the cause). */
struct json_object;
int kc_json_write(FILE *f, struct json_object *o);
/* Prometheus text format: a label value with its quotes. \\, \" and \n escaped as the format says; every
 * other control character and every byte that is not UTF-8 (which the format does not allow) written as
 * U+FFFD. */
void kc_put_prom(FILE *f, const char *s);
