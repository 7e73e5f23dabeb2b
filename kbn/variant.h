#pragma once
// Every task source is compiled once per variant: with -DKBN_VARIANT=baseline into namespace
// kbn::baseline, and (when tasks/candidate/ holds files) with -DKBN_VARIANT=candidate into kbn::candidate,
// where a file in tasks/candidate/ replaces its twin in tasks/baseline/ at the same relative path.
#ifndef KBN_VARIANT
#error "task sources are compiled per variant: define KBN_VARIANT=baseline or KBN_VARIANT=candidate"
#endif

#include "kbn/module.h"
#include "kbn/tensor.h"

#define KBN_STRINGIFY_(x) #x
#define KBN_STRINGIFY(x) KBN_STRINGIFY_(x)
#define KBN_VARIANT_NAME KBN_STRINGIFY(KBN_VARIANT)
