// The argument checks of the CPU references (reference_attention, quantize_reference, reference_attention_8bit):
// each throws InvalidArgument naming the argument.
#pragma once

#include <cstddef>

#include "wavealign/attention_shape.h"
#include "wavealign/mask.h"
#include "wavealign/quantize.h"
#include "wavealign/schedule.h"

namespace wavealign::reference {

/// batch, heads, tokens, head_dim and both block sides > 0.
void check_shape(const AttentionShape& shape);

/// `actual` values where `layout` (its name, e.g. "batch*heads*tokens") asks for `expected`.
void check_size(size_t actual, size_t expected, const char* argument, const char* layout);

/// The mask fits the call (check_call_against_plan) and is a valid CSR ("mask").
void check_mask(const CsrMask& mask, const AttentionShape& shape);

/// The schedule names every (entry, query block) of the call once ("schedule").
void check_schedule(const Schedule& schedule, const AttentionShape& shape);

/// `layout` is what quantized_layout gives for its own shapes ("layout").
void check_quantized_layout(const QuantizedLayout& layout);

}  // namespace wavealign::reference
