// SPDX-License-Identifier: MIT
/*
 * inifile: libinih with the settings dstage needs (see inifile.h).
 *
 * inifile_lock serialises every parse in the process, because libinih's
 * options are global; it is a leaf lock, held only around one parse.
 */
#include <pthread.h>

#include "inifile.h"

static pthread_mutex_t inifile_lock = PTHREAD_MUTEX_INITIALIZER;

int inifile_parse_stream(ini_reader reader, void *stream, ini_handler handler,
			 void *user, bool inline_comments)
{
	bool stack, realloc_ok, inline_old;
	int max_line, rc;

	pthread_mutex_lock(&inifile_lock);
	stack = ini_use_stack;
	realloc_ok = ini_allow_realloc;
	inline_old = ini_allow_inline_comments;
	max_line = ini_max_line;
	ini_use_stack = false;
	ini_allow_realloc = true;
	ini_allow_inline_comments = inline_comments;
	ini_max_line = INIFILE_MAX_LINE;
	rc = ini_parse_stream(reader, stream, handler, user);
	ini_use_stack = stack;
	ini_allow_realloc = realloc_ok;
	ini_allow_inline_comments = inline_old;
	ini_max_line = max_line;
	pthread_mutex_unlock(&inifile_lock);
	return rc;
}
