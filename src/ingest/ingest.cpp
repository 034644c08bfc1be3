#include "wavealign/ingest.h"

#include "ingest/ingest_rules.h"
#include "wavealign/error.h"

namespace wavealign {

namespace rules = ingest_rules;

namespace {

void check_sizes(int heads, int q_blocks, int kv_blocks) {
  WA_CHECK_ARG(heads >= 0, "heads", "must be >= 0, got ", heads);
  WA_CHECK_ARG(q_blocks >= 0, "q_blocks", "must be >= 0, got ", q_blocks);
  WA_CHECK_ARG(kv_blocks >= 0, "kv_blocks", "must be >= 0, got ", kv_blocks);
}

void check_shape(const DenseMaskView& view) {
  check_sizes(view.heads, view.q_blocks, view.kv_blocks);
  const bool empty = int64_t(view.heads) * view.q_blocks * view.kv_blocks == 0;
  WA_CHECK_ARG(empty || view.data != nullptr, "block_mask", "is null");
}

void check_shape(const CsrMaskView& view) {
  check_sizes(view.heads, view.q_blocks, view.kv_blocks);
  const int64_t rows = int64_t(view.heads) * view.q_blocks;
  WA_CHECK_ARG(view.row_ptr.size == rows + 1, "row_ptr", "has ", view.row_ptr.size,
               " entries, expected heads*q_blocks+1 = ", rows + 1);
  WA_CHECK_ARG(view.row_ptr.data != nullptr, "row_ptr", "is null");
  WA_CHECK_ARG(view.col_idx.size >= 0, "col_idx", "has ", view.col_idx.size, " entries");
  WA_CHECK_ARG(view.col_idx.size == 0 || view.col_idx.data != nullptr, "col_idx", "is null");
}

void check_pair(const FlexPair& pair, int64_t rows, const char* counts_name, const char* indices_name) {
  WA_CHECK_ARG(rows == 0 || pair.counts != nullptr, counts_name, "is null");
  WA_CHECK_ARG(pair.width >= 0, indices_name, "has width ", pair.width);
  WA_CHECK_ARG(rows == 0 || pair.width == 0 || pair.indices != nullptr, indices_name, "is null");
}

void check_shape(const FlexMaskView& view) {
  check_sizes(view.heads, view.q_blocks, view.kv_blocks);
  const int64_t rows = int64_t(view.heads) * view.q_blocks;
  check_pair(view.partial, rows, "kv_num_blocks", "kv_indices");
  if (view.has_full) check_pair(view.full, rows, "full_kv_num_blocks", "full_kv_indices");
}

// Each scan sets the kept bits in `mask` (of the view's shape, all zero) and stops at the first broken rule.

MaskError scan(const DenseMaskView& view, BlockMask& mask) {
  for (int h = 0; h < view.heads; ++h)
    for (int i = 0; i < view.q_blocks; ++i) {
      const uint8_t* row = view.data + h * view.strides[0] + i * view.strides[1];
      auto words = mask.row_words(h, i);
      for (int j = 0; j < view.kv_blocks; ++j)
        if (row[j * view.strides[2]]) words[j >> 6] |= uint64_t{1} << (j & 63);
    }
  return {};
}

MaskError scan(const CsrMaskView& view, BlockMask& mask) {
  const int64_t rows = int64_t(view.heads) * view.q_blocks;
  for (int64_t entry = 0; entry <= rows; ++entry) {
    const int64_t value = rules::index_at(view.row_ptr, entry);
    const int64_t previous = entry > 0 ? rules::index_at(view.row_ptr, entry - 1) : 0;
    if (rules::row_ptr_rule(entry, value, previous, rows, view.col_idx.size) != MaskErrorCode::kNone)
      return rules::csr_error_at(view, rules::row_ptr_key(entry));
  }
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t begin = rules::index_at(view.row_ptr, r), end = rules::index_at(view.row_ptr, r + 1);
    const int h = int(r / view.q_blocks), i = int(r % view.q_blocks);
    int64_t previous = 0;
    for (int64_t e = begin; e < end; ++e) {
      const int64_t column = rules::index_at(view.col_idx, e);
      if (rules::column_rule(column, previous, e == begin, view.kv_blocks) != MaskErrorCode::kNone)
        return rules::csr_error_at(view, rules::column_key(rows, e));
      mask.set(h, i, int(column));
      previous = column;
    }
  }
  return {};
}

MaskError scan(const FlexMaskView& view, BlockMask& mask) {
  for (int h = 0; h < view.heads; ++h)
    for (int i = 0; i < view.q_blocks; ++i) {
      const int64_t r = int64_t(h) * view.q_blocks + i;
      for (int part = 0; part < (view.has_full ? 2 : 1); ++part) {
        const bool full = part == 1;
        const FlexPair& pair = full ? view.full : view.partial;
        const int32_t count = rules::flex_count(pair, h, i);
        if (rules::count_rule(count, pair.width, full) != MaskErrorCode::kNone)
          return rules::flex_error_at(view, rules::flex_key(r, full, 0));
        for (int e = 0; e < count; ++e) {
          const int32_t j = rules::flex_index(pair, h, i, e);
          if (rules::index_rule(j, view.kv_blocks, full) != MaskErrorCode::kNone || mask.test(h, i, j))
            return rules::flex_error_at(view, rules::flex_key(r, full, e + 1));
          mask.set(h, i, j);
        }
      }
    }
  return {};
}

// The mask of the view with the first broken rule (code kNone: the mask is complete).
MaskError ingest_into(const MaskView& view, BlockMask& mask) {
  check_mask_shape(view);
  const MaskShape shape = mask_shape(view);
  mask = BlockMask(shape.heads, shape.q_blocks, shape.kv_blocks);
  return std::visit([&](const auto& form) { return scan(form, mask); }, view);
}

}  // namespace

MaskShape mask_shape(const MaskView& view) {
  return std::visit([](const auto& form) { return MaskShape{form.heads, form.q_blocks, form.kv_blocks}; }, view);
}

void check_mask_shape(const MaskView& view) {
  std::visit([](const auto& form) { check_shape(form); }, view);
}

MaskError find_mask_error(const MaskView& view) {
  BlockMask mask;
  return ingest_into(view, mask);
}

BlockMask ingest_mask(const MaskView& view) {
  BlockMask mask;
  const MaskError error = ingest_into(view, mask);
  if (error.code != int32_t(MaskErrorCode::kNone)) throw_mask_error(error);
  return mask;
}

const char* mask_error_argument(MaskErrorCode code) {
  switch (code) {
    case MaskErrorCode::kNone: return "block_mask";
    case MaskErrorCode::kRowPtrStart:
    case MaskErrorCode::kRowPtrDecreases: return "row_ptr";
    case MaskErrorCode::kRowPtrEnd:  // the two arrays disagree on nnz; the entries are col_idx's
    case MaskErrorCode::kColumnOutOfRange:
    case MaskErrorCode::kColumnNotAscending: return "col_idx";
    case MaskErrorCode::kCountOutOfRange: return "kv_num_blocks";
    case MaskErrorCode::kIndexOutOfRange:
    case MaskErrorCode::kIndexRepeated: return "kv_indices";
    case MaskErrorCode::kFullCountOutOfRange: return "full_kv_num_blocks";
    case MaskErrorCode::kFullIndexOutOfRange:
    case MaskErrorCode::kFullIndexRepeated: return "full_kv_indices";
    case MaskErrorCode::kQueryNotFinite: return "q";
    case MaskErrorCode::kKeyNotFinite: return "k";
  }
  return "block_mask";
}

std::string mask_error_text(const MaskError& error) {
  const std::string row = detail::concat("head ", error.head, ", query block ", error.row);
  switch (MaskErrorCode(error.code)) {
    case MaskErrorCode::kNone: return "is valid";
    case MaskErrorCode::kRowPtrStart: return detail::concat("must start at 0, got row_ptr[0] = ", error.value);
    case MaskErrorCode::kRowPtrDecreases:
      return detail::concat("decreases at entry ", error.entry, ": ", error.value, " after ", error.bound, " (", row,
                            " would end before it starts)");
    case MaskErrorCode::kRowPtrEnd:
      return detail::concat("has ", error.bound, " entries, but row_ptr ends at ", error.value);
    case MaskErrorCode::kColumnOutOfRange:
      return detail::concat("entry ", error.entry, " = ", error.value, " (", row, ") is outside [0, ", error.bound,
                            ")");
    case MaskErrorCode::kColumnNotAscending:
      return detail::concat("entry ", error.entry, " = ", error.value, " (", row,
                            ") does not ascend: the row's previous entry is ", error.bound);
    case MaskErrorCode::kCountOutOfRange:
    case MaskErrorCode::kFullCountOutOfRange:
      return detail::concat(row, ": count ", error.value, " is outside [0, ", error.bound, "] (the indices' width)");
    case MaskErrorCode::kIndexOutOfRange:
    case MaskErrorCode::kFullIndexOutOfRange:
      return detail::concat(row, ", entry ", error.entry, " = ", error.value, " is outside [0, ", error.bound, ")");
    case MaskErrorCode::kIndexRepeated:
      return detail::concat(row, ", entry ", error.entry, " lists block ", error.value, " twice");
    case MaskErrorCode::kFullIndexRepeated:
      return detail::concat(row, ", entry ", error.entry, " lists block ", error.value,
                            ", which the row already lists (in kv_indices or full_kv_indices)");
    case MaskErrorCode::kQueryNotFinite:
    case MaskErrorCode::kKeyNotFinite:
      return detail::concat("holds ", error.value == 0 ? "NaN" : error.value > 0 ? "+inf" : "-inf", " at head ",
                            error.head, ", token ", error.entry, ", channel ", error.bound,
                            ": the mask methods score finite values only");
  }
  return detail::concat("breaks an unknown rule (code ", error.code, ")");
}

void throw_mask_error(const MaskError& error) {
  throw InvalidArgument(mask_error_argument(MaskErrorCode(error.code)), mask_error_text(error));
}

}  // namespace wavealign
