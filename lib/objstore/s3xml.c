// SPDX-License-Identifier: MIT
/*
 * s3xml: S3 XML responses in, the CompleteMultipartUpload body out.
 *
 * State: libxml2 is initialized once per process (pthread_once); every parse
 * has its own parser context, with a SAX hook that stops the parser at a DTD
 * and a structured error hook that keeps libxml2 from printing, so calls are
 * safe from any thread at once.
 */
#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <libxml/parser.h>
#include <libxml/tree.h>
#include <libxml/xmlerror.h>

#include "dstage/grow.h"
#include "dstage/log.h"
#include "s3xml.h"
#include "util/strutil.h"

#define S3XML_MAX_PARTS 10000
/* Marks a parser context that met a DTD (ctxt->_private). */
static char s3xml_saw_dtd;
static pthread_once_t s3xml_once = PTHREAD_ONCE_INIT;

static void s3xml_init(void)
{
	xmlInitParser();
}

/* SAX hook: a DTD (internal or external subset) stops the parse. */
static void s3xml_sax_dtd(void *ctx, const xmlChar *name,
			  const xmlChar *external_id, const xmlChar *system_id)
{
	xmlParserCtxtPtr ctxt = ctx;

	(void)name;
	(void)external_id;
	(void)system_id;
	ctxt->_private = &s3xml_saw_dtd;
	xmlStopParser(ctxt);
}

/* Structured error hook: keep quiet; the error is read back afterwards. */
static void s3xml_sax_error(void *ctx, xmlErrorPtr error)
{
	(void)ctx;
	(void)error;
}

/*
 * Parse body into *doc. what names the expected document in messages; quiet
 * logs failures at debug level only. Returns 0, -EINVAL or -ENOMEM.
 */
static int s3xml_read(const char *body, size_t len, const char *what,
		      bool quiet, xmlDocPtr *doc)
{
	xmlParserCtxtPtr ctxt = NULL;
	const char *why = NULL;
	char msg[256] = "";
	int r = 0;

	*doc = NULL;
	if (!body || len == 0 || len > S3XML_MAX_BODY) {
		why = len ? "body too large" : "empty body";
		r = -EINVAL;
		goto out;
	}
	if (memchr(body, '\0', len)) {
		why = "a NUL byte in the body";
		r = -EINVAL;
		goto out;
	}
	pthread_once(&s3xml_once, s3xml_init);
	ctxt = xmlNewParserCtxt();
	if (!ctxt || !ctxt->sax) {
		r = -ENOMEM;
		goto out;
	}
	ctxt->sax->internalSubset = s3xml_sax_dtd;
	ctxt->sax->externalSubset = s3xml_sax_dtd;
	ctxt->sax->serror = s3xml_sax_error;
	*doc = xmlCtxtReadMemory(ctxt, body, (int)len, NULL, NULL,
				 XML_PARSE_NONET | XML_PARSE_NOCDATA);
	if (ctxt->_private == &s3xml_saw_dtd) {
		why = "a DTD is not allowed";
		r = -EINVAL;
	} else if (!*doc || !ctxt->wellFormed) {
		const xmlError *e = xmlCtxtGetLastError(ctxt);

		if (e && e->code == XML_ERR_NO_MEMORY) {
			r = -ENOMEM;
		} else {
			if (e && e->message) {
				size_t n;

				snprintf(msg, sizeof(msg), "line %d: %s",
					 e->line, e->message);
				n = strlen(msg);
				while (n && (msg[n - 1] == '\n' ||
					     msg[n - 1] == ' '))
					msg[--n] = '\0';
			}
			why = msg[0] ? msg : "not well-formed";
			r = -EINVAL;
		}
	}
	if (r && *doc) {
		xmlFreeDoc(*doc);
		*doc = NULL;
	}
out:
	if (ctxt)
		xmlFreeParserCtxt(ctxt);
	if (r == -EINVAL) {
		if (quiet)
			log_debug("s3xml: %s: %s", what, why);
		else
			log_error("s3xml: %s: %s", what, why);
	}
	return r;
}

static bool s3xml_is(const xmlNode *n, const char *name)
{
	return n && n->type == XML_ELEMENT_NODE &&
	       strcmp((const char *)n->name, name) == 0;
}

static const xmlNode *s3xml_child(const xmlNode *parent, const char *name)
{
	for (const xmlNode *c = parent->children; c; c = c->next)
		if (s3xml_is(c, name))
			return c;
	return NULL;
}

/* The text of node, malloc'd. Returns 0 or -ENOMEM. */
static int s3xml_text(const xmlNode *node, char **out)
{
	xmlChar *t = xmlNodeGetContent(node);

	*out = NULL;
	if (!t)
		return -ENOMEM;
	*out = strdup((const char *)t);
	xmlFree(t);
	return *out ? 0 : -ENOMEM;
}

/* The text of parent's first child element name; *out NULL when absent. */
static int s3xml_child_text(const xmlNode *parent, const char *name, char **out)
{
	const xmlNode *c = s3xml_child(parent, name);

	*out = NULL;
	return c ? s3xml_text(c, out) : 0;
}

/* Copy name's text into a fixed buffer (truncated); "" when absent. */
static void s3xml_child_copy(const xmlNode *parent, const char *name, char *dst,
			     size_t dlen)
{
	const xmlNode *c = s3xml_child(parent, name);
	xmlChar *t = c ? xmlNodeGetContent(c) : NULL;

	snprintf(dst, dlen, "%s", t ? (const char *)t : "");
	xmlFree(t);
}

static bool s3xml_space(char c)
{
	return c == ' ' || c == '\t' || c == '\n' || c == '\r';
}

/* A plain decimal, surrounding blanks allowed, at most INT64_MAX. */
static int s3xml_parse_u64(const char *s, uint64_t *out)
{
	uint64_t v = 0;
	int digits = 0;

	while (s3xml_space(*s))
		s++;
	for (; *s >= '0' && *s <= '9'; s++, digits++) {
		unsigned d = (unsigned)(*s - '0');

		if (v > ((uint64_t)INT64_MAX - d) / 10)
			return -EINVAL;
		v = v * 10 + d;
	}
	while (s3xml_space(*s))
		s++;
	if (!digits || *s)
		return -EINVAL;
	*out = v;
	return 0;
}

/* Decode an EncodingType=url key in place ('+' is a space). */
static int s3xml_url_decode(char *s)
{
	char *o = s;

	for (; *s; s++) {
		if (*s == '+') {
			*o++ = ' ';
		} else if (*s == '%') {
			int hi = strutil_hexval(s[1]);
			int lo = hi < 0 ? -1 : strutil_hexval(s[2]);

			if (lo < 0 || (hi == 0 && lo == 0))
				return -EINVAL;
			*o++ = (char)(hi << 4 | lo);
			s += 2;
		} else {
			*o++ = *s;
		}
	}
	*o = '\0';
	return 0;
}

/* A listed Key in place: decoded when url (EncodingType=url), then neither
 * empty nor longer than S3XML_MAX_KEY. Returns 0, or -EINVAL with why set. */
static int s3xml_key_check(char *key, bool url, const char **why)
{
	if (url && s3xml_url_decode(key)) {
		*why = "a Key with a bad or NUL %-escape";
		return -EINVAL;
	}
	if (!key[0] || strlen(key) > S3XML_MAX_KEY) {
		*why = "an empty or overlong Key";
		return -EINVAL;
	}
	return 0;
}

static int64_t s3xml_days_from_civil(int64_t y, int m, int d)
{
	/* Days since 1970-01-01 in the proleptic Gregorian calendar. */
	int64_t era, yoe, doy, doe;

	y -= m <= 2;
	era = (y >= 0 ? y : y - 399) / 400;
	yoe = y - era * 400;
	doy = (153 * (m + (m > 2 ? -3 : 9)) + 2) / 5 + d - 1;
	doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
	return era * 146097 + doe - 719468;
}

/* n digits at s into *v; false if any is not a digit. */
static bool s3xml_digits(const char *s, int n, int *v)
{
	*v = 0;
	for (int i = 0; i < n; i++) {
		if (s[i] < '0' || s[i] > '9')
			return false;
		*v = *v * 10 + (s[i] - '0');
	}
	return true;
}

int s3xml_parse_iso8601(const char *s, int64_t *out)
{
	static const int mdays[] = { 31, 29, 31, 30, 31, 30,
				     31, 31, 30, 31, 30, 31 };
	int y, mo, d, h, mi, sec, oh = 0, om = 0, sign = 0;
	bool leap;

	if (!s || !out || strlen(s) < 20)
		return -EINVAL;
	if (!s3xml_digits(s, 4, &y) || s[4] != '-' ||
	    !s3xml_digits(s + 5, 2, &mo) || s[7] != '-' ||
	    !s3xml_digits(s + 8, 2, &d) || (s[10] != 'T' && s[10] != 't') ||
	    !s3xml_digits(s + 11, 2, &h) || s[13] != ':' ||
	    !s3xml_digits(s + 14, 2, &mi) || s[16] != ':' ||
	    !s3xml_digits(s + 17, 2, &sec))
		return -EINVAL;
	s += 19;
	if (*s == '.') {
		int frac = 0;

		for (s++; *s >= '0' && *s <= '9'; s++)
			frac++;
		if (!frac || frac > 9)
			return -EINVAL;
	}
	if (*s == 'Z' || *s == 'z') {
		s++;
	} else if (*s == '+' || *s == '-') {
		sign = *s == '-' ? -1 : 1;
		if (!s3xml_digits(s + 1, 2, &oh) || s[3] != ':' ||
		    !s3xml_digits(s + 4, 2, &om) || oh > 23 || om > 59)
			return -EINVAL;
		s += 6;
	} else {
		return -EINVAL;
	}
	if (*s)
		return -EINVAL;
	leap = (y % 4 == 0 && y % 100 != 0) || y % 400 == 0;
	if (mo < 1 || mo > 12 || d < 1 || d > mdays[mo - 1] ||
	    (mo == 2 && d == 29 && !leap) || h > 23 || mi > 59 || sec > 60)
		return -EINVAL;
	if (sec == 60)
		sec = 59; /* a leap second is the second before */
	*out = s3xml_days_from_civil(y, mo, d) * 86400 + h * 3600 + mi * 60 +
	       sec - (int64_t)sign * (oh * 3600 + om * 60);
	return 0;
}

void s3xml_list_release(struct s3xml_list *l)
{
	if (!l)
		return;
	for (size_t i = 0; i < l->nobjects; i++) {
		free(l->objects[i].key);
		free(l->objects[i].etag);
	}
	free(l->objects);
	free(l->next_token);
	memset(l, 0, sizeof(*l));
}

/* Parse one listing item (an element) into item. 0, -EINVAL (why set) or
 * -ENOMEM; what it filled before failing is freed by the list's release. */
typedef int (*s3xml_item_fn)(const xmlNode *c, bool url, void *item,
			     const char **why);

/* One <Contents> into item (a struct s3xml_object): an s3xml_item_fn.
 * Returns 0, -EINVAL (why set) or -ENOMEM. */
static int s3xml_parse_contents(const xmlNode *c, bool url, void *item,
				const char **why)
{
	struct s3xml_object *o = item;
	char *t = NULL;
	int r;

	r = s3xml_child_text(c, "Key", &o->key);
	if (r)
		return r;
	if (!o->key) {
		*why = "Contents without a Key";
		return -EINVAL;
	}
	r = s3xml_key_check(o->key, url, why);
	if (r)
		return r;
	r = s3xml_child_text(c, "Size", &t);
	if (r)
		return r;
	if (!t || s3xml_parse_u64(t, &o->size)) {
		*why = "Contents without a valid Size";
		r = -EINVAL;
		goto out;
	}
	free(t);
	r = s3xml_child_text(c, "LastModified", &t);
	if (r)
		return r;
	if (t && s3xml_parse_iso8601(t, &o->mtime)) {
		*why = "a bad LastModified";
		r = -EINVAL;
		goto out;
	}
	r = s3xml_child_text(c, "ETag", &o->etag);
	if (!r && !o->etag) {
		o->etag = strdup("");
		if (!o->etag)
			r = -ENOMEM;
	}
out:
	free(t);
	return r;
}

/*
 * The start both listing answers share: read the document (*doc, freed by
 * the caller, also on error), check its root element is name, and read
 * whether its keys are URL-encoded and whether it is truncated. 0, or
 * -EINVAL with *why set (or s3xml_read's error).
 */
static int s3xml_list_open(const char *body, size_t len, const char *name,
			   xmlDocPtr *doc, const xmlNode **root, bool *url,
			   bool *truncated, const char **why)
{
	char *t = NULL;
	int r;

	r = s3xml_read(body, len, name, false, doc);
	if (r)
		return r;
	*root = xmlDocGetRootElement(*doc);
	if (!s3xml_is(*root, name)) {
		*why = "not the answer asked for";
		return -EINVAL;
	}
	r = s3xml_child_text(*root, "EncodingType", &t);
	if (r)
		return r;
	*url = t && strcmp(t, "url") == 0;
	free(t);
	t = NULL;
	r = s3xml_child_text(*root, "IsTruncated", &t);
	if (!r && t && strcmp(t, "true") && strcmp(t, "false")) {
		*why = "IsTruncated is neither true nor false";
		r = -EINVAL;
	}
	*truncated = t && strcmp(t, "true") == 0;
	free(t);
	return r;
}

/*
 * The loop both listings share: every child of root named name, parsed by
 * fn into a new array of item_size-byte items (*items, NULL when none).
 * *n counts an item before it is parsed, so that the list's release frees
 * a half-filled one. 0, -ENOMEM, or fn's error.
 */
static int s3xml_list_items(const xmlNode *root, const char *name, bool url,
			    size_t item_size, s3xml_item_fn fn, void **items,
			    size_t *n, const char **why)
{
	size_t count = 0;

	for (const xmlNode *c = root->children; c; c = c->next)
		count += s3xml_is(c, name);
	if (!count)
		return 0;
	*items = calloc(count, item_size);
	if (!*items)
		return -ENOMEM;
	for (const xmlNode *c = root->children; c; c = c->next) {
		int r;

		if (!s3xml_is(c, name))
			continue;
		r = fn(c, url, (char *)*items + item_size * (*n)++, why);
		if (r)
			return r;
	}
	return 0;
}

int s3xml_parse_list(const char *body, size_t len, struct s3xml_list *out)
{
	const char *why = NULL;
	const xmlNode *root;
	xmlDocPtr doc = NULL;
	void *items = NULL;
	bool url = false;
	int r;

	memset(out, 0, sizeof(*out));
	r = s3xml_list_open(body, len, "ListBucketResult", &doc, &root, &url,
			    &out->truncated, &why);
	if (!r)
		r = s3xml_child_text(root, "NextContinuationToken",
				     &out->next_token);
	if (!r)
		r = s3xml_list_items(
			root, "Contents", url, sizeof(*out->objects),
			s3xml_parse_contents, &items, &out->nobjects, &why);
	out->objects = items;
	xmlFreeDoc(doc);
	if (r) {
		if (r == -EINVAL && why)
			log_error("s3xml: ListBucketResult: %s", why);
		s3xml_list_release(out);
	}
	return r;
}

void s3xml_mpu_list_release(struct s3xml_mpu_list *l)
{
	if (!l)
		return;
	for (size_t i = 0; i < l->nuploads; i++) {
		free(l->uploads[i].key);
		free(l->uploads[i].upload_id);
	}
	free(l->uploads);
	free(l->next_key);
	free(l->next_id);
	memset(l, 0, sizeof(*l));
}

/* One <Upload> into item (a struct s3xml_mpu): an s3xml_item_fn.
 * Returns 0, -EINVAL (why set) or -ENOMEM. */
static int s3xml_parse_mpu(const xmlNode *c, bool url, void *item,
			   const char **why)
{
	struct s3xml_mpu *u = item;
	char *t = NULL;
	int r;

	r = s3xml_child_text(c, "Key", &u->key);
	if (!r)
		r = s3xml_child_text(c, "UploadId", &u->upload_id);
	if (r)
		return r;
	if (!u->key || !u->upload_id || !u->upload_id[0]) {
		*why = "an Upload without a Key or UploadId";
		return -EINVAL;
	}
	r = s3xml_key_check(u->key, url, why);
	if (r)
		return r;
	r = s3xml_child_text(c, "Initiated", &t);
	if (!r && t && s3xml_parse_iso8601(t, &u->initiated)) {
		*why = "a bad Initiated";
		r = -EINVAL;
	}
	free(t);
	return r;
}

int s3xml_parse_mpu_list(const char *body, size_t len,
			 struct s3xml_mpu_list *out)
{
	const char *why = NULL;
	const xmlNode *root;
	xmlDocPtr doc = NULL;
	void *items = NULL;
	bool url = false;
	int r;

	memset(out, 0, sizeof(*out));
	r = s3xml_list_open(body, len, "ListMultipartUploadsResult", &doc,
			    &root, &url, &out->truncated, &why);
	if (r)
		goto out;
	r = s3xml_child_text(root, "NextKeyMarker", &out->next_key);
	if (!r)
		r = s3xml_child_text(root, "NextUploadIdMarker", &out->next_id);
	if (r)
		goto out;
	if (url && out->next_key && s3xml_url_decode(out->next_key)) {
		why = "a NextKeyMarker with a bad or NUL %-escape";
		r = -EINVAL;
		goto out;
	}
	r = s3xml_list_items(root, "Upload", url, sizeof(*out->uploads),
			     s3xml_parse_mpu, &items, &out->nuploads, &why);
	out->uploads = items;
out:
	xmlFreeDoc(doc);
	if (r) {
		if (r == -EINVAL && why)
			log_error("s3xml: ListMultipartUploadsResult: %s", why);
		s3xml_mpu_list_release(out);
	}
	return r;
}

/* Fill e from an <Error> element. */
static void s3xml_fill_error(const xmlNode *root, struct s3xml_error *e)
{
	s3xml_child_copy(root, "Code", e->code, sizeof(e->code));
	s3xml_child_copy(root, "Message", e->message, sizeof(e->message));
}

int s3xml_parse_error(const char *body, size_t len, struct s3xml_error *out)
{
	xmlDocPtr doc = NULL;
	int r;

	memset(out, 0, sizeof(*out));
	r = s3xml_read(body, len, "Error", true, &doc);
	if (r)
		return -EINVAL;
	if (s3xml_is(xmlDocGetRootElement(doc), "Error"))
		s3xml_fill_error(xmlDocGetRootElement(doc), out);
	else
		r = -EINVAL;
	xmlFreeDoc(doc);
	return r;
}

int s3xml_parse_upload_id(const char *body, size_t len, char **upload_id)
{
	const xmlNode *root;
	xmlDocPtr doc = NULL;
	int r;

	*upload_id = NULL;
	r = s3xml_read(body, len, "InitiateMultipartUploadResult", false, &doc);
	if (r)
		return r;
	root = xmlDocGetRootElement(doc);
	if (!s3xml_is(root, "InitiateMultipartUploadResult")) {
		log_error("s3xml: not an InitiateMultipartUploadResult");
		r = -EINVAL;
		goto out;
	}
	r = s3xml_child_text(root, "UploadId", upload_id);
	if (r)
		goto out;
	if (!*upload_id || !**upload_id) {
		log_error("s3xml: InitiateMultipartUploadResult without an "
			  "UploadId");
		free(*upload_id);
		*upload_id = NULL;
		r = -EINVAL;
	}
out:
	xmlFreeDoc(doc);
	return r;
}

int s3xml_parse_complete(const char *body, size_t len, char **etag,
			 struct s3xml_error *err)
{
	struct s3xml_error e = { 0 };
	const xmlNode *root;
	xmlDocPtr doc = NULL;
	int r;

	*etag = NULL;
	if (err)
		memset(err, 0, sizeof(*err));
	r = s3xml_read(body, len, "CompleteMultipartUploadResult", false, &doc);
	if (r)
		return r;
	root = xmlDocGetRootElement(doc);
	if (s3xml_is(root, "Error")) {
		s3xml_fill_error(root, &e);
		log_error(
			"s3xml: the server answered 200 with an Error: %s%s%s",
			e.code[0] ? e.code : "(no code)",
			e.message[0] ? ": " : "", e.message);
		if (err)
			*err = e;
		r = -EIO;
		goto out;
	}
	if (!s3xml_is(root, "CompleteMultipartUploadResult") &&
	    !s3xml_is(root, "CopyObjectResult") &&
	    !s3xml_is(root, "CopyPartResult")) {
		log_error("s3xml: not a CompleteMultipartUploadResult, "
			  "CopyObjectResult or CopyPartResult");
		r = -EINVAL;
		goto out;
	}
	r = s3xml_child_text(root, "ETag", etag);
	if (!r && !*etag) {
		*etag = strdup("");
		if (!*etag)
			r = -ENOMEM;
	}
out:
	xmlFreeDoc(doc);
	return r;
}

/* Append s to *p (length *len, capacity *cap), XML-escaped if esc. */
static int s3xml_append(char **p, size_t *len, size_t *cap, const char *s,
			bool esc)
{
	for (; *s; s++) {
		const char *rep = NULL;
		char one[2] = { *s, '\0' };
		size_t n;

		if (esc) {
			switch (*s) {
			case '&':
				rep = "&amp;";
				break;
			case '<':
				rep = "&lt;";
				break;
			case '>':
				rep = "&gt;";
				break;
			case '"':
				rep = "&quot;";
				break;
			case '\'':
				rep = "&apos;";
				break;
			}
		}
		if (!rep)
			rep = one;
		n = strlen(rep);
		if (grow_array(p, cap, *len + n + 1, 1, 256))
			return -ENOMEM;
		memcpy(*p + *len, rep, n + 1);
		*len += n;
	}
	return 0;
}

char *s3xml_build_complete(const char *const *etags, size_t n)
{
	char *p = NULL;
	size_t len = 0, cap = 0;
	char num[32];
	int r;

	if (!etags || n == 0 || n > S3XML_MAX_PARTS) {
		errno = EINVAL;
		return NULL;
	}
	for (size_t i = 0; i < n; i++) {
		if (!etags[i]) {
			errno = EINVAL;
			return NULL;
		}
	}
	r = s3xml_append(&p, &len, &cap, "<CompleteMultipartUpload>", false);
	for (size_t i = 0; i < n && !r; i++) {
		snprintf(num, sizeof(num), "%zu", i + 1);
		r = s3xml_append(&p, &len, &cap, "<Part><PartNumber>", false);
		if (!r)
			r = s3xml_append(&p, &len, &cap, num, false);
		if (!r)
			r = s3xml_append(&p, &len, &cap, "</PartNumber><ETag>",
					 false);
		if (!r)
			r = s3xml_append(&p, &len, &cap, etags[i], true);
		if (!r)
			r = s3xml_append(&p, &len, &cap, "</ETag></Part>",
					 false);
	}
	if (!r)
		r = s3xml_append(&p, &len, &cap, "</CompleteMultipartUpload>",
				 false);
	if (r) {
		free(p);
		errno = ENOMEM;
		return NULL;
	}
	return p;
}
