/*
 * train_internal.h — helpers shared by the files of the train layer only.
 */
#ifndef DTRAIN_TRAIN_INTERNAL_H
#define DTRAIN_TRAIN_INTERNAL_H

#include "dtrain/train.h"

#endif
