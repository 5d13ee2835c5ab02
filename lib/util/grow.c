// SPDX-License-Identifier: MIT
/* grow: doubling arrays (include/dstage/grow.h). */
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "dstage/grow.h"

int grow_array(void *vp, size_t *cap, size_t need, size_t size, size_t first)
{
	size_t c = *cap ? *cap : (first ? first : 1);
	void *old, *nv;

	if (need <= *cap)
		return 0;
	while (c < need) {
		if (c > SIZE_MAX / 2)
			return -ENOMEM;
		c *= 2;
	}
	if (size && c > SIZE_MAX / size)
		return -ENOMEM;
	/* The pointer is read and written as bytes, so that vp may be the
	 * address of any object pointer type without aliasing it as void *. */
	memcpy(&old, vp, sizeof(old));
	nv = realloc(old, c * size);
	if (!nv)
		return -ENOMEM;
	memcpy(vp, &nv, sizeof(nv));
	*cap = c;
	return 0;
}
