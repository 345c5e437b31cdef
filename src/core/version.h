/* version.h — owns the build's identity: the git commit llmi was built from, stamped
 * into every report row.  The value lives in one generated object that the Makefile
 * rebuilds whenever HEAD moves, so no other object goes stale. */
#ifndef LLMI_VERSION_H
#define LLMI_VERSION_H

const char *llmi_commit(void);

#endif
