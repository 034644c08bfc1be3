// Mask ingest: the one set of rules by which a dense, CSR or FlexAttention mask becomes a BlockMask. The CPU
// plan (BlockMask::from_dense / from_csr / from_flex), the CLI's .npy masks, the Python bindings and the GPU
// planner's device validation all apply these rules, so every entrance accepts and refuses the same masks
// with the same message.
//
// A mask arrives as a view: pointers and strides (in elements) into memory the caller owns. Host ingest reads
// the values through the view; the GPU planner takes the same views with device pointers (DeviceMask).
//
// Rules, checked in this order (the first violation is the one reported):
//   dense  [heads, q_blocks, kv_blocks] bytes: nonzero = kept. Any value is valid.
//   CSR    row_ptr [heads*q_blocks + 1] (int64 or int32), col_idx [nnz] (int32 or int64), row r = head *
//          q_blocks + query block: row_ptr[0] = 0; row_ptr never decreases; row_ptr[heads*q_blocks] = nnz;
//          then each row's col_idx entries, in order: in [0, kv_blocks), strictly ascending within the row.
//   Flex   per row (head, query block) in order: kv_num_blocks in [0, width of kv_indices]; its first
//          kv_num_blocks entries of kv_indices, in order: in [0, kv_blocks), no block listed twice; then the
//          same for the optional full pair (full_kv_num_blocks, full_kv_indices), where a block that the
//          partial pair already lists counts as listed twice. A row keeps the union of both pairs.
#pragma once

#include <cstdint>
#include <string>
#include <variant>

#include "wavealign/mask.h"

namespace wavealign {

enum class IndexType : uint8_t { kInt32, kInt64 };

/// A 1-D integer array: entry i at data + i * stride elements.
struct IndexArray {
  const void* data = nullptr;
  IndexType type = IndexType::kInt64;
  int64_t size = 0;
  int64_t stride = 1;
};

/// Dense bytes [heads, q_blocks, kv_blocks] (bool or uint8), any strides (elements = bytes).
struct DenseMaskView {
  int heads = 0;
  int q_blocks = 0;
  int kv_blocks = 0;
  const uint8_t* data = nullptr;
  int64_t strides[3] = {0, 0, 1};
};

/// CSR over heads * q_blocks rows.
struct CsrMaskView {
  int heads = 0;
  int q_blocks = 0;
  int kv_blocks = 0;
  IndexArray row_ptr;  // [heads * q_blocks + 1]
  IndexArray col_idx;  // [nnz]
};

/// One FlexAttention (count, indices) pair: counts int32 [heads, q_blocks], indices int32 [heads, q_blocks,
/// width]; the first counts[h, i] entries of indices[h, i, :] are the row's blocks.
struct FlexPair {
  const int32_t* counts = nullptr;
  int64_t count_strides[2] = {0, 1};
  const int32_t* indices = nullptr;
  int64_t index_strides[3] = {0, 0, 1};
  int width = 0;
};

/// A FlexAttention BlockMask's blocks: the partial pair (kv_num_blocks, kv_indices) and, when has_full, the
/// full pair (full_kv_num_blocks, full_kv_indices). A batch dimension folds into heads.
struct FlexMaskView {
  int heads = 0;
  int q_blocks = 0;
  int kv_blocks = 0;
  FlexPair partial;
  FlexPair full;
  bool has_full = false;
};

using MaskView = std::variant<DenseMaskView, CsrMaskView, FlexMaskView>;

/// Which rule a mask's values break (kNone: none). The names of the arguments they concern are
/// mask_error_argument's.
enum class MaskErrorCode : int32_t {
  kNone = 0,
  kRowPtrStart = 1,          // row_ptr[0] != 0
  kRowPtrDecreases = 2,      // row_ptr[entry] < row_ptr[entry - 1]
  kRowPtrEnd = 3,            // row_ptr[heads*q_blocks] != nnz, the entries of col_idx (named "col_idx")
  kColumnOutOfRange = 4,     // col_idx[entry] outside [0, kv_blocks)
  kColumnNotAscending = 5,   // col_idx[entry] <= the row's previous entry
  kCountOutOfRange = 6,      // kv_num_blocks outside [0, width]
  kIndexOutOfRange = 7,      // kv_indices entry outside [0, kv_blocks)
  kIndexRepeated = 8,        // kv_indices lists a block twice in one row
  kFullCountOutOfRange = 9,  // full_kv_num_blocks outside [0, width]
  kFullIndexOutOfRange = 10, // full_kv_indices entry outside [0, kv_blocks)
  kFullIndexRepeated = 11,   // full_kv_indices lists a block twice, or one that kv_indices lists
  // A mask method's input holds NaN or inf (wavealign/methods.h): no mask describes it. head: the mask head,
  // entry: the token, bound: the channel, value: 0 for NaN, +1 for +inf, -1 for -inf.
  kQueryNotFinite = 12,
  kKeyNotFinite = 13,
};

/// The first rule a mask breaks, with what is needed to say so: the same record on the host and, written by
/// the GPU planner, on the device (GpuPlanOutputs::error; 40 bytes, the code first, so a kernel reading only
/// the first int32 sees nonzero = invalid).
struct MaskError {
  int32_t code = 0;    // MaskErrorCode
  int32_t head = 0;    // the row's head (a FlexAttention batch folded into heads)
  int32_t row = 0;     // the row's query block
  int32_t reserved = 0;
  int64_t entry = 0;   // CSR: index into row_ptr or col_idx; Flex: position in the row's index list
  int64_t value = 0;   // the offending value
  int64_t bound = 0;   // what it broke: the previous row_ptr or column, nnz, kv_blocks or the width
};
static_assert(sizeof(MaskError) == 40);

/// The argument a code concerns, as the user passed it: "row_ptr", "col_idx", "kv_num_blocks", ...
const char* mask_error_argument(MaskErrorCode code);
/// The message of an InvalidArgument for `error` (without the "invalid argument '<name>': " prefix).
std::string mask_error_text(const MaskError& error);
/// Throws InvalidArgument(mask_error_argument(code), mask_error_text(error)); `error.code` must not be kNone.
[[noreturn]] void throw_mask_error(const MaskError& error);

/// Shapes of a view: non-negative sizes, row_ptr's length, the Flex widths. Reads no values, so it also
/// checks views of device memory. Throws InvalidArgument naming the argument.
void check_mask_shape(const MaskView& view);
/// The first rule that a view of host memory breaks (code kNone when it is valid). Checks the shape first.
MaskError find_mask_error(const MaskView& view);
/// The mask of a view of host memory; throws InvalidArgument naming the argument for the first broken rule.
BlockMask ingest_mask(const MaskView& view);

/// heads, q_blocks, kv_blocks of any view.
struct MaskShape {
  int heads = 0;
  int q_blocks = 0;
  int kv_blocks = 0;
};
MaskShape mask_shape(const MaskView& view);

}  // namespace wavealign
