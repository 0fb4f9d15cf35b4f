/*
 * precision.c — names of the training compute precisions (dt_precision).
 */
#include "dtrain/amp.h"

static const char *const precision_names[DT_PRECISION_COUNT] = {"fp32", "bf16", "fp16"};

const char *dt_precision_name(dt_precision p) {
    return (unsigned)p < DT_PRECISION_COUNT ? precision_names[p] : "?";
}

dt_status dt_precision_parse(const char *knob, const char *text, dt_precision *out) {
    int idx;
    DT_CHECK(dt_config_parse_enum(knob, text, precision_names, DT_PRECISION_COUNT, &idx));
    *out = (dt_precision)idx;
    return DT_OK;
}
