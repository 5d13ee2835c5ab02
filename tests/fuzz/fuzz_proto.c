// SPDX-License-Identifier: MIT
/*
 * fuzz_proto: proto_parse on any bytes; a line that parses is emitted again
 * with proto_add_mem and must parse back to the same fields.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "dstage/proto.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static struct proto_msg m, m2;
	struct proto_buf b = { 0 };

	if (proto_parse(&m, (const char *)data, size))
		return 0;
	for (unsigned i = 0; i < m.n; i++)
		proto_add_mem(&b, m.f[i].key, m.f[i].val, m.f[i].len);
	if (proto_end(&b) == 0) {
		if (proto_parse(&m2, b.data, b.len - 1) || m2.n != m.n)
			abort();
		for (unsigned i = 0; i < m.n; i++)
			if (strcmp(m.f[i].key, m2.f[i].key) ||
			    m.f[i].len != m2.f[i].len ||
			    memcmp(m.f[i].val, m2.f[i].val, m.f[i].len))
				abort();
	}
	proto_free(&b);
	return 0;
}
