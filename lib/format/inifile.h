/* SPDX-License-Identifier: MIT */
/*
 * inifile: libinih with the settings dstage needs.
 *
 * Debian's libinih keeps its options in process-wide variables and, by
 * default, parses lines of at most 200 bytes on the stack: a longer value
 * (a session token, a long path) would be cut and the rest parsed as a line
 * of its own. inifile_parse_stream() sets the options for one parse (heap
 * line buffer, lines up to INIFILE_MAX_LINE) under one lock and restores
 * them after, so the config and credentials parsers never see each other's
 * settings.
 */
#ifndef DSTAGE_INIFILE_H
#define DSTAGE_INIFILE_H

#include <stdbool.h>

#include <ini.h>

#define INIFILE_MAX_LINE (64 * 1024)

/*
 * ini_parse_stream() with lines up to INIFILE_MAX_LINE; ';' and '#' start
 * a comment after a value only when inline_comments is set (secrets may
 * hold them). Returns what ini_parse_stream returns: 0, the first bad line's
 * number, or -1 / -2 (cannot read, out of memory).
 */
int inifile_parse_stream(ini_reader reader, void *stream, ini_handler handler,
			 void *user, bool inline_comments);

#endif
