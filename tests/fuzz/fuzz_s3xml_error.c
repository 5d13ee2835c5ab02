// SPDX-License-Identifier: MIT
/*
 * Fuzz s3xml_parse_error: 0 with NUL-terminated code and message that fit,
 * or -EINVAL with both empty.
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
	log_set_level((enum log_level)(LOG_LVL_ERROR - 1));
	return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct s3xml_error e;
	int r;

	memset(&e, 'x', sizeof(e));
	r = s3xml_parse_error((const char *)data, size, &e);
	if (r != 0 && r != -EINVAL)
		abort();
	if (!memchr(e.code, '\0', sizeof(e.code)) ||
	    !memchr(e.message, '\0', sizeof(e.message)))
		abort();
	if (r && (e.code[0] || e.message[0]))
		abort();
	return 0;
}
