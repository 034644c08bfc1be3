"""torch.library custom ops of wavealign, with fake (meta) implementations for torch.compile.

    torch.ops.wavealign.sparse_attention(q, k, v, row_ptr, col_idx, schedules, q_block, kv_block, scale,
                                         traversal, kernel) -> (O, LSE)
    torch.ops.wavealign.permute_rows(x, permutation, block) -> x in plan order
    torch.ops.wavealign.unpermute_rows(x, inverse, block, seq_len) -> x in the original order

They are registered the first time wavealign meets a torch tensor (or on `register()`), so importing
wavealign never imports torch. The Python entry points (wavealign.sparse_attention, Plan.permute_rows,
Plan.unpermute_rows) call them with the plan's tensors; a compiled module sees one opaque node per call.
"""

import threading

from ._util import require_torch

_registered = False
_lock = threading.Lock()  # two threads meeting their first tensor at once register the ops once


def register() -> None:
    """Registers the ops with torch (once; later calls return at once)."""
    if _registered:
        return
    with _lock:
        _register()


def _register() -> None:
    global _registered
    if _registered:
        return
    torch = require_torch("wavealign's torch ops")
    from . import _attention, _rows

    @torch.library.custom_op("wavealign::sparse_attention", mutates_args=(),
                             schema="(Tensor q, Tensor k, Tensor v, Tensor row_ptr, Tensor col_idx, "
                                    "Tensor schedules, int q_block, int kv_block, float scale, str traversal, "
                                    "str kernel) -> (Tensor, Tensor)")
    def sparse_attention(q, k, v, row_ptr, col_idx, schedules, q_block, kv_block, scale, traversal, kernel):
        if q.device.type == "cuda":
            return _attention.attention_op_cuda(q, k, v, row_ptr, col_idx, schedules, q_block, kv_block, scale,
                                                traversal, kernel)
        if q.device.type != "cpu":
            raise ValueError(f"invalid argument 'q': device {q.device} is not supported (cpu or cuda)")
        return _attention.attention_op_cpu(q, k, v, row_ptr.cpu(), col_idx.cpu(), schedules.cpu(), q_block,
                                           kv_block, scale)

    @sparse_attention.register_fake
    def _(q, k, v, row_ptr, col_idx, schedules, q_block, kv_block, scale, traversal, kernel):
        o, lse, _ = _attention.output_like(q, k, v)
        return o, lse

    @torch.library.custom_op("wavealign::permute_rows", mutates_args=(),
                             schema="(Tensor x, Tensor permutation, int block) -> Tensor")
    def permute_rows(x, permutation, block):
        return _rows.permute_torch(x, permutation, block)

    @permute_rows.register_fake
    def _(x, permutation, block):
        return x.new_empty((*x.shape[:-2], permutation.shape[-1] * block, x.shape[-1]))

    @torch.library.custom_op("wavealign::unpermute_rows", mutates_args=(),
                             schema="(Tensor x, Tensor inverse, int block, int seq_len) -> Tensor")
    def unpermute_rows(x, inverse, block, seq_len):
        return _rows.unpermute_torch(x, inverse, block, seq_len)

    @unpermute_rows.register_fake
    def _(x, inverse, block, seq_len):
        return x.new_empty((*x.shape[:-2], seq_len, x.shape[-1]))

    _registered = True
