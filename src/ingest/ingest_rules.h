// The value rules of mask ingest (include/wavealign/ingest.h) as functions that the host ingest
// (ingest/ingest.cpp) and the GPU planner's device validation (cuda/plan/validate.cu, bitpack.cu) share.
//
// Both sides look for the first broken rule in one scan order, expressed as a 64-bit key (smaller = earlier):
// the host scans in order and stops, the device checks every entry in parallel and keeps the smallest key of
// a violation (atomicMin). Either side then builds the record from the key with the same decoder
// (csr_error_at, flex_error_at), reading the view again, so the record and its message are the same.
#pragma once

#include <cstdint>

#include "common/host_device.h"
#include "wavealign/ingest.h"

namespace wavealign::ingest_rules {

/// The key of "no violation found".
constexpr uint64_t kNoViolation = ~uint64_t{0};

WA_HOST_DEVICE inline int64_t index_at(const IndexArray& array, int64_t i) {
  return array.type == IndexType::kInt32 ? int64_t(static_cast<const int32_t*>(array.data)[i * array.stride])
                                         : static_cast<const int64_t*>(array.data)[i * array.stride];
}

// ---- CSR: row_ptr entries 0 .. rows, then col_idx entries 0 .. nnz-1 -------------------------------------

WA_HOST_DEVICE constexpr uint64_t row_ptr_key(int64_t entry) { return uint64_t(entry); }
WA_HOST_DEVICE constexpr uint64_t column_key(int64_t rows, int64_t entry) { return uint64_t(rows + 1 + entry); }

/// Rule of row_ptr[entry] (of rows + 1 entries), given row_ptr[entry - 1] (ignored for entry 0).
WA_HOST_DEVICE inline MaskErrorCode row_ptr_rule(int64_t entry, int64_t value, int64_t previous, int64_t rows,
                                                 int64_t nnz) {
  if (entry == 0 && value != 0) return MaskErrorCode::kRowPtrStart;
  if (entry > 0 && value < previous) return MaskErrorCode::kRowPtrDecreases;
  if (entry == rows && value != nnz) return MaskErrorCode::kRowPtrEnd;
  return MaskErrorCode::kNone;
}

/// Rule of one col_idx entry; `previous` is the row's previous entry (ignored for the row's first).
WA_HOST_DEVICE inline MaskErrorCode column_rule(int64_t column, int64_t previous, bool first_in_row, int kv_blocks) {
  if (column < 0 || column >= kv_blocks) return MaskErrorCode::kColumnOutOfRange;
  if (!first_in_row && column <= previous) return MaskErrorCode::kColumnNotAscending;
  return MaskErrorCode::kNone;
}

/// The row that holds col_idx entry `entry` of a CSR whose row_ptr is valid: the last row r with
/// row_ptr[r] <= entry (empty rows before it share its start).
WA_HOST_DEVICE inline int64_t row_of_entry(const IndexArray& row_ptr, int64_t rows, int64_t entry) {
  int64_t low = 0, high = rows - 1;  // row_ptr[0] = 0 <= entry
  while (low < high) {
    const int64_t middle = low + (high - low + 1) / 2;
    if (index_at(row_ptr, middle) <= entry)
      low = middle;
    else
      high = middle - 1;
  }
  return low;
}

WA_HOST_DEVICE inline void set_row(MaskError& error, int64_t row, int q_blocks) {
  error.head = q_blocks > 0 ? int32_t(row / q_blocks) : 0;
  error.row = q_blocks > 0 ? int32_t(row % q_blocks) : 0;
}

/// The record of the violation at `key` (a key that the scan found: the rules before it hold).
WA_HOST_DEVICE inline MaskError csr_error_at(const CsrMaskView& view, uint64_t key) {
  const int64_t rows = int64_t(view.heads) * view.q_blocks;
  const int64_t nnz = view.col_idx.size;
  MaskError error;
  if (key <= uint64_t(rows)) {
    const int64_t entry = int64_t(key);
    const int64_t value = index_at(view.row_ptr, entry);
    const int64_t previous = entry > 0 ? index_at(view.row_ptr, entry - 1) : 0;
    const MaskErrorCode code = row_ptr_rule(entry, value, previous, rows, nnz);
    error.code = int32_t(code);
    error.entry = entry;
    error.value = value;
    error.bound = code == MaskErrorCode::kRowPtrDecreases ? previous : code == MaskErrorCode::kRowPtrEnd ? nnz : 0;
    set_row(error, entry > 0 ? entry - 1 : 0, view.q_blocks);  // row_ptr[entry] ends row entry - 1
    return error;
  }
  const int64_t entry = int64_t(key) - rows - 1;
  const int64_t row = row_of_entry(view.row_ptr, rows, entry);
  const bool first = entry == index_at(view.row_ptr, row);
  const int64_t column = index_at(view.col_idx, entry);
  const int64_t previous = first ? 0 : index_at(view.col_idx, entry - 1);
  const MaskErrorCode code = column_rule(column, previous, first, view.kv_blocks);
  error.code = int32_t(code);
  error.entry = entry;
  error.value = column;
  error.bound = code == MaskErrorCode::kColumnOutOfRange ? view.kv_blocks : previous;
  set_row(error, row, view.q_blocks);
  return error;
}

// ---- FlexAttention: per row, the partial pair's count then its entries, then the full pair's ------------

/// position 0 = the count, 1 + e = entry e of the row's index list.
WA_HOST_DEVICE constexpr uint64_t flex_key(int64_t row, bool full, int64_t position) {
  return (uint64_t(row) << 32) | (uint64_t(full) << 31) | uint64_t(position);
}

WA_HOST_DEVICE inline MaskErrorCode count_rule(int64_t count, int width, bool full) {
  if (count >= 0 && count <= width) return MaskErrorCode::kNone;
  return full ? MaskErrorCode::kFullCountOutOfRange : MaskErrorCode::kCountOutOfRange;
}

/// Range rule of one index; a listed-twice index is kIndexRepeated / kFullIndexRepeated.
WA_HOST_DEVICE inline MaskErrorCode index_rule(int64_t index, int kv_blocks, bool full) {
  if (index >= 0 && index < kv_blocks) return MaskErrorCode::kNone;
  return full ? MaskErrorCode::kFullIndexOutOfRange : MaskErrorCode::kIndexOutOfRange;
}

WA_HOST_DEVICE constexpr MaskErrorCode repeat_code(bool full) {
  return full ? MaskErrorCode::kFullIndexRepeated : MaskErrorCode::kIndexRepeated;
}

WA_HOST_DEVICE inline int32_t flex_count(const FlexPair& pair, int64_t head, int64_t row) {
  return pair.counts[head * pair.count_strides[0] + row * pair.count_strides[1]];
}
WA_HOST_DEVICE inline int32_t flex_index(const FlexPair& pair, int64_t head, int64_t row, int64_t entry) {
  return pair.indices[head * pair.index_strides[0] + row * pair.index_strides[1] + entry * pair.index_strides[2]];
}

/// The record of the violation at `key`. An entry whose index is in range can only have been found listed
/// twice.
WA_HOST_DEVICE inline MaskError flex_error_at(const FlexMaskView& view, uint64_t key) {
  const int64_t row = int64_t(key >> 32);
  const bool full = ((key >> 31) & 1u) != 0;
  const int64_t position = int64_t(key & 0x7FFFFFFFu);
  const FlexPair& pair = full ? view.full : view.partial;
  MaskError error;
  set_row(error, row, view.q_blocks);
  if (position == 0) {
    error.code = int32_t(count_rule(flex_count(pair, error.head, error.row), pair.width, full));
    error.value = flex_count(pair, error.head, error.row);
    error.bound = pair.width;
    return error;
  }
  error.entry = position - 1;
  error.value = flex_index(pair, error.head, error.row, error.entry);
  const MaskErrorCode range = index_rule(error.value, view.kv_blocks, full);
  error.code = int32_t(range != MaskErrorCode::kNone ? range : repeat_code(full));
  error.bound = view.kv_blocks;
  return error;
}

}  // namespace wavealign::ingest_rules
