// SPDX-License-Identifier: MIT
/*
 * fuzz_proto: proto_parse on any bytes; a line that parses is emitted again
 * with proto_add_mem and must parse back to the same fields. Each field's
 * value also goes through the number parsers (the daemon reads parallel=,
 * bandwidth=, priority= with them): a u64 they accept prints back as
 * itself (but for leading zeros), and a non-negative i64 written
 * without a sign is the same u64.
 */
#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
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
	for (unsigned i = 0; i < m.n; i++) {
		char back[32];
		uint64_t u;
		int64_t v;

		if (!proto_get_u64(&m, m.f[i].key, &u)) {
			snprintf(back, sizeof(back), "%" PRIu64, u);
			if (strcmp(back, proto_get(&m, m.f[i].key)) &&
			    proto_get(&m, m.f[i].key)[0] != '0')
				abort();
		}
		if (!proto_get_i64(&m, m.f[i].key, &v) && v >= 0 &&
		    proto_get(&m, m.f[i].key)[0] != '-' &&
		    (proto_get_u64(&m, m.f[i].key, &u) || u != (uint64_t)v))
			abort(); /* a non-negative i64 is a u64 of that value */
	}
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
