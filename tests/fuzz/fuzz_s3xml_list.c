// SPDX-License-Identifier: MIT
/*
 * Fuzz s3xml_parse_list: any bytes in, either -EINVAL/-ENOMEM and an empty
 * list, or a list whose every entry keeps the documented invariants.
 */
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "dstage/log.h"
#include "objstore/s3xml.h"

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
	(void)argc;
	(void)argv;
	/* Below LOG_LVL_ERROR: no log lines at all, the fuzzer's output only */
	log_set_level((enum log_level)(LOG_LVL_ERROR - 1));
	return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct s3xml_list l;
	int r = s3xml_parse_list((const char *)data, size, &l);

	if (r) {
		if ((r != -EINVAL && r != -ENOMEM) || l.objects || l.nobjects ||
		    l.next_token)
			abort();
		return 0;
	}
	for (size_t i = 0; i < l.nobjects; i++) {
		const struct s3xml_object *o = &l.objects[i];

		if (!o->key || !o->key[0] || strlen(o->key) > S3XML_MAX_KEY ||
		    !o->etag || o->size > (uint64_t)INT64_MAX)
			abort();
	}
	s3xml_list_release(&l);
	if (l.objects || l.nobjects || l.next_token || l.truncated)
		abort();
	return 0;
}
