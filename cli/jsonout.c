// SPDX-License-Identifier: MIT
/*
 * jsonout: the tools' --json output, written with jansson.
 *
 * Policy for strings that are not valid UTF-8 (object keys are bytes, and
 * a bucket or a file:// tree may hold any; docs/stager.md): JSON text must
 * be UTF-8, so a field F whose value is not valid UTF-8 is written as
 *   "F":       the value with each invalid byte replaced by U+FFFD
 *              (for people; not the key),
 *   "F_utf8":  false,
 *   "F_hex":   the value's raw bytes in lowercase hex (the exact key:
 *              bytes.fromhex(obj["F_hex"]) in Python).
 * Valid UTF-8 values are written as they are, with neither extra field.
 *
 * Stateless.
 */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "jsonout.h"

/* Length of the valid UTF-8 sequence at p (n bytes left), 0 if invalid. */
static size_t jsonout_utf8_len(const unsigned char *p, size_t n)
{
	unsigned char c = p[0], lo = 0x80, hi = 0xbf;
	size_t len;

	if (c < 0x80)
		return 1;
	if (c >= 0xc2 && c <= 0xdf)
		len = 2;
	else if (c >= 0xe0 && c <= 0xef)
		len = 3;
	else if (c >= 0xf0 && c <= 0xf4)
		len = 4;
	else
		return 0;
	if (c == 0xe0)
		lo = 0xa0; /* no overlong forms */
	else if (c == 0xed)
		hi = 0x9f; /* no surrogates */
	else if (c == 0xf0)
		lo = 0x90;
	else if (c == 0xf4)
		hi = 0x8f; /* nothing past U+10FFFF */
	if (n < len || p[1] < lo || p[1] > hi)
		return 0;
	for (size_t i = 2; i < len; i++)
		if (p[i] < 0x80 || p[i] > 0xbf)
			return 0;
	return len;
}

bool jsonout_utf8_valid(const char *s, size_t n)
{
	const unsigned char *p = (const unsigned char *)s;

	for (size_t i = 0; i < n;) {
		size_t l = jsonout_utf8_len(p + i, n - i);

		if (!l)
			return false;
		i += l;
	}
	return true;
}

int jsonout_set_str(json_t *obj, const char *field, const char *val)
{
	static const char hex[] = "0123456789abcdef";
	const unsigned char *p = (const unsigned char *)val;
	size_t n = strlen(val), o = 0, h = 0, name_size = strlen(field) + 6;
	char *fixed = NULL, *raw = NULL, *name = NULL;
	int ret = -ENOMEM;

	if (jsonout_utf8_valid(val, n))
		return json_object_set_new(obj, field, json_stringn(val, n))
			       ? -ENOMEM
			       : 0;
	fixed = malloc(n * 3 + 1);
	raw = malloc(n * 2 + 1);
	name = malloc(name_size); /* field, "_utf8", NUL */
	if (!fixed || !raw || !name)
		goto out;
	for (size_t i = 0; i < n;) {
		size_t l = jsonout_utf8_len(p + i, n - i);

		if (l) {
			memcpy(fixed + o, p + i, l);
			o += l;
			i += l;
		} else {
			memcpy(fixed + o, "\xef\xbf\xbd", 3); /* U+FFFD */
			o += 3;
			i++;
		}
	}
	for (size_t i = 0; i < n; i++) {
		raw[h++] = hex[p[i] >> 4];
		raw[h++] = hex[p[i] & 15];
	}
	if (json_object_set_new(obj, field, json_stringn(fixed, o)))
		goto out;
	snprintf(name, name_size, "%s_utf8", field);
	if (json_object_set_new(obj, name, json_false()))
		goto out;
	snprintf(name, name_size, "%s_hex", field);
	if (json_object_set_new(obj, name, json_stringn(raw, h)))
		goto out;
	ret = 0;
out:
	free(fixed);
	free(raw);
	free(name);
	return ret;
}

int jsonout_print(json_t *doc)
{
	int ret = 0;

	if (!doc) {
		fprintf(stderr, "stager: out of memory writing JSON\n");
		return -ENOMEM;
	}
	if (json_dumpf(doc, stdout, JSON_COMPACT) || putchar('\n') == EOF ||
	    fflush(stdout))
		ret = -EIO;
	if (ret)
		fprintf(stderr, "stager: writing the JSON output failed\n");
	return ret;
}

static bool jsonout_in(const char *k, const char *const *strs)
{
	for (; strs && *strs; strs++)
		if (!strcmp(k, *strs))
			return true;
	return false;
}

/* s as an int64 when it is written as one plainly; false otherwise. */
static bool jsonout_int(const char *s, json_int_t *v)
{
	const char *p = s;
	long long n;
	char *end;

	if (*p == '-')
		p++;
	if (!*p || (*p == '0' && p[1]))
		return false;
	for (; *p; p++)
		if (*p < '0' || *p > '9')
			return false;
	errno = 0;
	n = strtoll(s, &end, 10);
	if (errno || *end)
		return false;
	*v = (json_int_t)n;
	return true;
}

json_t *jsonout_row(const struct proto_msg *m, const char *const *strs)
{
	json_t *o = json_object();

	for (unsigned i = 0; o && i < m->n; i++) {
		const struct proto_field *f = &m->f[i];
		json_int_t v;
		int ret;

		if (!strcmp(f->key, "type"))
			continue;
		if (!jsonout_in(f->key, strs) && jsonout_int(f->val, &v))
			ret = json_object_set_new(o, f->key, json_integer(v));
		else
			ret = jsonout_set_str(o, f->key, f->val);
		if (ret) {
			json_decref(o);
			o = NULL;
		}
	}
	return o;
}
