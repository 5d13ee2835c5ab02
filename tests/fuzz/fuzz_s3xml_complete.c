// SPDX-License-Identifier: MIT
/*
 * Fuzz the multipart documents: s3xml_parse_complete (with and without an
 * error out), s3xml_parse_upload_id, s3xml_parse_iso8601 on the same bytes,
 * and s3xml_build_complete on the input's lines, whose result must parse as
 * XML again.
 */
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "dstage/log.h"
#include "objstore/s3xml.h"

#define FUZZ_MAX_PARTS 64

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
	(void)argc;
	(void)argv;
	log_set_level((enum log_level)(LOG_LVL_ERROR - 1));
	return 0;
}

static void fuzz_build(const char *s)
{
	const char *etags[FUZZ_MAX_PARTS];
	struct s3xml_error e;
	char *copy = strdup(s), *p, *save = NULL, *body, *etag = NULL;
	size_t n = 0;

	if (!copy)
		return;
	for (p = strtok_r(copy, "\n", &save); p && n < FUZZ_MAX_PARTS;
	     p = strtok_r(NULL, "\n", &save))
		etags[n++] = p;
	body = n ? s3xml_build_complete(etags, n) : NULL;
	if (n && !body && errno != ENOMEM)
		abort();
	/* Well-formed, and not a result document */
	if (body &&
	    s3xml_parse_complete(body, strlen(body), &etag, &e) != -EINVAL)
		abort();
	free(etag);
	free(body);
	free(copy);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct s3xml_error e;
	char *etag = NULL, *id = NULL, *s;
	int64_t t;
	int r;

	r = s3xml_parse_complete((const char *)data, size, &etag, &e);
	if (r == 0 && !etag)
		abort();
	if (r && etag)
		abort();
	free(etag);
	etag = NULL;
	r = s3xml_parse_complete((const char *)data, size, &etag, NULL);
	free(etag);
	if (r && r != -EIO && r != -EINVAL && r != -ENOMEM)
		abort();

	r = s3xml_parse_upload_id((const char *)data, size, &id);
	if (r == 0 && (!id || !id[0]))
		abort();
	free(id);

	s = malloc(size + 1);
	if (!s)
		return 0;
	memcpy(s, data, size);
	s[size] = '\0';
	(void)s3xml_parse_iso8601(s, &t);
	fuzz_build(s);
	free(s);
	return 0;
}
