/* SPDX-License-Identifier: MIT */
/*
 * banned: C library calls the project's own code may not use, each turned
 * into a compile error that names it. CMakeLists.txt force-includes this
 * header (-include) first in every file of lib/, fs/, cli/, stager/ and
 * cachectl/, and tests/CMakeLists.txt in the unit tests (tests/unit/) and
 * the test tools (tests/tools/); the benchmarks, the fuzz harnesses, the
 * fault-injection shim and the stand-in libcudart build without it.
 *
 * Banned, with what to use instead:
 *   strcpy, strcat, stpcpy, strncpy, strncat, sprintf, vsprintf, gets:
 *     no bound, or a bound that silently truncates or leaves the result
 *     unterminated. Use snprintf/vsnprintf into a sized buffer (and check
 *     for truncation where it matters), memcpy of a length already known,
 *     or asprintf.
 *   strtok, gmtime, localtime, ctime, asctime: hidden static state, not
 *     thread-safe. Use strtok_r, gmtime_r, localtime_r, strftime.
 *   tmpnam, mktemp: the name can be taken before it is opened. Use mkstemp,
 *     mkdtemp or O_TMPFILE.
 *
 * A use reads, for instance:
 *   error: 'sorry_strcpy_is_banned_see_lib_util_banned_h' undeclared
 *
 * The macros are function-like, so a later declaration of the same name
 * would be broken by them: the headers that declare these functions are
 * included here first, and their include guards keep them from being read
 * again. A name used without a call (a member st_ctime, a variable called
 * gets) is left alone.
 */
#ifndef DSTAGE_BANNED_H
#define DSTAGE_BANNED_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define DSTAGE_BANNED(func) sorry_##func##_is_banned_see_lib_util_banned_h

#undef strcpy
#define strcpy(...) DSTAGE_BANNED(strcpy)
#undef strcat
#define strcat(...) DSTAGE_BANNED(strcat)
#undef stpcpy
#define stpcpy(...) DSTAGE_BANNED(stpcpy)
#undef strncpy
#define strncpy(...) DSTAGE_BANNED(strncpy)
#undef strncat
#define strncat(...) DSTAGE_BANNED(strncat)
#undef sprintf
#define sprintf(...) DSTAGE_BANNED(sprintf)
#undef vsprintf
#define vsprintf(...) DSTAGE_BANNED(vsprintf)
#undef gets
#define gets(...) DSTAGE_BANNED(gets)

#undef strtok
#define strtok(...) DSTAGE_BANNED(strtok)
#undef gmtime
#define gmtime(...) DSTAGE_BANNED(gmtime)
#undef localtime
#define localtime(...) DSTAGE_BANNED(localtime)
#undef ctime
#define ctime(...) DSTAGE_BANNED(ctime)
#undef asctime
#define asctime(...) DSTAGE_BANNED(asctime)

#undef tmpnam
#define tmpnam(...) DSTAGE_BANNED(tmpnam)
#undef mktemp
#define mktemp(...) DSTAGE_BANNED(mktemp)

#endif
