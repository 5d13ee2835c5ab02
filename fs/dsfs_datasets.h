/* SPDX-License-Identifier: MIT */
/*
 * dsfs_datasets: a subtree, the read-only dataset view, datasets\/<name>\/<key...>.
 * See dsfs_datasets.c for its state and dsfs_subtree.h for the hooks.
 */
#ifndef DSFS_DATASETS_H
#define DSFS_DATASETS_H

#include "dsfs_subtree.h"

extern const struct dsfs_subtree dsfs_datasets_subtree;

#endif
