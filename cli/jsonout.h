/* SPDX-License-Identifier: MIT */
/*
 * jsonout: the tools' --json output (jansson), with its policy for
 * strings that are not valid UTF-8 (see jsonout.c and docs/stager.md).
 */
#ifndef DSTAGE_CLI_JSONOUT_H
#define DSTAGE_CLI_JSONOUT_H

#include <stdbool.h>
#include <stddef.h>

#include <jansson.h>

#include "dstage/proto.h"

/* true when s[0..n) is valid UTF-8 (no overlong forms, surrogates or code
 * points past U+10FFFF). */
bool jsonout_utf8_valid(const char *s, size_t n);

/*
 * obj[field] = val. A val that is not valid UTF-8 is written with U+FFFD
 * for each invalid byte, plus field_utf8=false and field_hex=<its bytes in
 * hex>. Returns 0 or -ENOMEM.
 */
int jsonout_set_str(json_t *obj, const char *field, const char *val);

/*
 * The fields of a daemon protocol row m, except "type", as one JSON object:
 * a value written as a plain decimal integer (no sign but '-', no leading
 * zero, within int64) becomes a JSON number unless its key is in strs (a
 * NULL-terminated list, or NULL), every other value a string under the
 * policy of jsonout_set_str. Returns the object, or NULL (out of memory).
 */
json_t *jsonout_row(const struct proto_msg *m, const char *const *strs);

/* Print doc compactly and a newline on stdout. Returns 0, -ENOMEM (doc is
 * NULL: building it failed) or -EIO (message printed). Does not free doc. */
int jsonout_print(json_t *doc);

#endif
